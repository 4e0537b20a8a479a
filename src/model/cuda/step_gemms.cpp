#include "model/cuda/step_gemms.h"

#include <array>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/error.h"
#include "model/cuda/gpu_buffers.h"
#include "model/cuda/gpu_layout.h"
#include "model/cuda/layer_matrices.h"
#include "model/cuda/layer_program.h"
#include "model/cuda/lora_layout.h"
#include "model/lora.h"

namespace qtrain {

namespace {

struct StepMatrix {
    LayerOp op;
    const char* name;
    int64_t in, out;  // out: also the row stride of its y and dy, which LoRA's targets write in slices
    bool bias;
    MatrixLoraTargets lora;  // the adapters' targets on it and their columns (layer_matrices.h, as the model)
};

// A layer's four (fused) matrices, in layer order.
std::array<StepMatrix, 4> layer_matrices(const ModelConfig& c) {
    const int64_t h = c.hidden_size, I = c.intermediate_size, q = c.q_dim(), kv = c.kv_dim();
    return {{
        {LayerOp::QkvLinear, "qkv", h, q + 2 * kv, c.qkv_bias, matrix_lora_targets(c, kQkv)},
        {LayerOp::OutLinear, "o", q, h, c.o_bias, matrix_lora_targets(c, kO)},
        {LayerOp::GateUpLinear, "gate|up", h, 2 * I, c.mlp_bias, matrix_lora_targets(c, kGateUp)},
        {LayerOp::DownLinear, "down", I, h, c.mlp_bias, matrix_lora_targets(c, kDown)},
    }};
}

// Whether LoRA's adapters cover all of a matrix's output without dropout: then (lever 5,
// CudaModel::linear_fwd / linear_bwd) the base GEMM accumulates onto what they wrote (beta = 1), in the
// forward only where the matrix has no bias.
bool lora_writes_whole(const LoraOptions& lora, const StepMatrix& m) {
    if (!lora.enabled() || lora.dropout > 0.0f) return false;
    for (int j = 0; j < m.lora.n; ++j)
        if (!lora.has(m.lora.targets[j])) return false;
    return true;
}

// Which matrices' forward the backward's recompute runs again: the layer program's choice.
class RecomputedMatrices {
public:
    RecomputedMatrices(const ModelConfig& c, const ModelOptions& o)
        : program_(make_layer_program(make_gpu_layout(c))), rc_(recompute_set(o)) {}
    bool operator()(LayerOp op) const {
        for (const LayerStep& s : program_.steps)
            if (s.op == op) return recompute_run(s, rc_) == StepRun::Recompute;
        return false;
    }

private:
    LayerProgram program_;
    RecomputeSet rc_;
};

}  // namespace

const char* gemm_pass_name(GemmPass p) {
    switch (p) {
        case GemmPass::Forward: return "fwd";
        case GemmPass::Recompute: return "recompute";
        case GemmPass::InputGrad: return "dx";
        case GemmPass::WeightGrad: return "dw";
    }
    return "?";
}

std::vector<StepGemm> step_gemms(const ModelConfig& c, const ModelOptions& o) {
    QT_CHECK(o.batch_size > 0 && o.seq_len > 0 && o.lmhead_chunks > 0,
             "step_gemms: internal error (a micro-batch needs batch_size, seq_len and lmhead_chunks > 0)");
    const int64_t N = static_cast<int64_t>(o.batch_size) * o.seq_len;
    const int64_t h = c.hidden_size;
    const int L = c.num_hidden_layers;
    const bool fp8 = o.matmul_dtype == DType::E4M3;   // CudaModel::fp8_
    const bool fp8_grads = fp8 && is_fp8(o.gradient_dtype);  // CudaModel::fp8_grads_
    const bool frozen = o.lora.enabled();
    const bool fast_fwd = o.fp8_fast_accum != Fp8FastAccum::Off, fast_bwd = o.fp8_fast_accum == Fp8FastAccum::All;
    const std::array<StepMatrix, 4> matrices = layer_matrices(c);
    const RecomputedMatrices recomputed(c, o);

    std::vector<StepGemm> list;
    auto add = [&](const StepMatrix& m, GemmPass pass, const std::string& name, int64_t tokens, int calls) {
        StepGemm g;
        g.name = name;
        g.pass = pass;
        g.tokens = tokens;
        g.in = m.in;
        g.out = m.out;
        g.calls = calls;
        g.dtype = o.model_dtype;
        return &list.emplace_back(std::move(g));
    };
    for (const StepMatrix& m : matrices) {
        const bool whole = lora_writes_whole(o.lora, m);
        for (GemmPass pass : {GemmPass::Forward, GemmPass::Recompute}) {
            if (pass == GemmPass::Recompute && !recomputed(m.op)) continue;
            StepGemm* g = add(m, pass, std::string(gemm_pass_name(pass)) + " " + m.name, N, L);
            g->fp8 = fp8;
            g->fast_accum = fp8 && fast_fwd;
            g->bias = m.bias;
            g->beta = whole && !m.bias ? 1.0f : 0.0f;
        }
        StepGemm* dx = add(m, GemmPass::InputGrad, std::string("dx ") + m.name, N, L);
        dx->fp8 = fp8_grads;
        dx->grad_dtype = fp8_grads ? o.gradient_dtype : o.model_dtype;
        dx->fast_accum = fp8_grads && fast_bwd;
        dx->beta = whole ? 1.0f : 0.0f;
        if (frozen) continue;  // a frozen base: no weight gradient
        StepGemm* dw = add(m, GemmPass::WeightGrad, std::string("dw ") + m.name, N, L);
        dw->fp8 = fp8_grads;
        dw->grad_dtype = dx->grad_dtype;
        dw->fast_accum = fp8_grads && fast_bwd;
        // staged gradients: each matrix's dW GEMM writes its part of the layer's zeroed-elsewhere slot
        // (Gradients::matrices_written_whole); else it accumulates into the flat fp32 gradient
        dw->beta = gradients_staged(o) ? 0.0f : 1.0f;
    }
    // the LM head, chunk by chunk (CudaModel::lm_head): rows of ceil(N / chunks), the last one shorter
    const int64_t rows = (N + o.lmhead_chunks - 1) / o.lmhead_chunks;
    const int full = static_cast<int>(N / rows);
    const int64_t rest = N - full * rows;
    const StepMatrix head{LayerOp::DownLinear, "lm head", h, c.vocab_size, false, {{}, {}, 0}};
    // trained: the full model's head, or LoRA's with --train-also=embeddings (the head or the tied table)
    const bool head_trained = !frozen || (o.lora.train_also & kTrainEmbeddings) != 0;
    const bool head_fp8_bwd = o.fp8_lm_head && fp8_grads;  // its dx and dW in FP8, never fast accumulation
    for (auto [tokens, calls] : {std::pair<int64_t, int>{rows, full}, std::pair<int64_t, int>{rest, 1}}) {
        if (tokens == 0 || calls == 0) continue;
        StepGemm* f = add(head, GemmPass::Forward, "fwd lm head", tokens, calls);
        f->fp8 = o.fp8_lm_head;
        f->fast_accum = o.fp8_lm_head && fast_fwd;
        StepGemm* dx = add(head, GemmPass::InputGrad, "dx lm head", tokens, calls);
        dx->fp8 = head_fp8_bwd;
        dx->grad_dtype = head_fp8_bwd ? o.gradient_dtype : o.model_dtype;
        if (!head_trained) continue;
        StepGemm* dw = add(head, GemmPass::WeightGrad, "dw lm head", tokens, calls);
        dw->fp8 = head_fp8_bwd;
        dw->grad_dtype = dx->grad_dtype;
        dw->beta = 1.0f;
    }
    return list;
}

namespace {

// The byte alignment of a slice's pointer and row strides (LoraAdapters' alignment_of), the buffers
// themselves 256-byte aligned.
int alignment_of(std::initializer_list<int64_t> bytes) {
    int a = 256;
    for (int64_t v : bytes)
        while (a > 1 && v % a != 0) a /= 2;
    return a;
}

}  // namespace

std::vector<StepGemm> lora_step_gemms(const ModelConfig& c, const ModelOptions& o) {
    std::vector<StepGemm> list;
    if (!o.lora.enabled()) return list;
    const int64_t N = static_cast<int64_t>(o.batch_size) * o.seq_len;
    const int64_t r = o.lora.rank;
    const int64_t es = static_cast<int64_t>(dtype_size(o.model_dtype));
    const int L = c.num_hidden_layers;
    const LoraLayout layout = make_lora_layout(c, o.lora);
    const RecomputedMatrices recomputed(c, o);
    auto add = [&](GemmPass pass, std::string name, int64_t in, int64_t out, int64_t ld_in, int64_t ld_out,
                   int align, float beta) {
        StepGemm g;
        g.name = "lora " + std::move(name);
        g.pass = pass;
        g.tokens = N, g.in = in, g.out = out, g.calls = L;
        g.dtype = o.model_dtype;
        g.grad_dtype = o.model_dtype;
        g.beta = pass == GemmPass::WeightGrad ? 1.0f : beta;
        g.lora = true;
        g.ld_in = ld_in, g.ld_out = ld_out;
        g.min_alignment = align;
        list.push_back(std::move(g));
    };
    for (const StepMatrix& m : layer_matrices(c)) {
        std::array<LoraTarget, 3> present{};
        std::array<int64_t, 3> at{};
        int G = 0;
        for (int j = 0; j < m.lora.n; ++j)
            if (o.lora.has(m.lora.targets[j])) present[G] = m.lora.targets[j], at[G++] = m.lora.cols[j];
        if (G == 0) continue;
        const bool whole = lora_writes_whole(o.lora, m);      // lever 5: the adapters write dx
        const float y_beta = whole && !m.bias ? 0.0f : 1.0f;  // and y, where the base has no bias
        const int64_t in = lora_target_shape(c, present[0])[1];
        const std::string mn = m.name;
        // (each alignment as LoraAdapters computes it for that call: the slices' offsets and every row stride)
        if (layout.stacked(0, present.data(), G)) {
            const int64_t w = G * r;
            for (GemmPass pass : {GemmPass::Forward, GemmPass::Recompute}) {
                if (pass == GemmPass::Recompute && !recomputed(m.op)) continue;
                const std::string pn = pass == GemmPass::Forward ? "fwd " : "recompute ";
                add(pass, pn + "u " + mn, in, w, in, w, alignment_of({w * es, in * es}), 0.0f);  // u = x [A..]^T
                for (int j = 0; j < G; ++j)  // y_j (+)= s u_j B_j^T
                    add(pass, pn + "y " + lora_target_name(present[j]), r, lora_target_shape(c, present[j])[0], w,
                        m.out, alignment_of({at[j] * es, j * r * es, m.out * es, w * es, r * es}), y_beta);
            }
            for (int j = 0; j < G; ++j) {
                const int64_t out = lora_target_shape(c, present[j])[0];
                add(GemmPass::InputGrad, std::string("dx g ") + lora_target_name(present[j]), r, out, w, m.out,
                    alignment_of({j * r * es, at[j] * es, w * es, m.out * es, r * es}), 0.0f);  // g_j = s dy_j B_j
                add(GemmPass::WeightGrad, std::string("dw B ") + lora_target_name(present[j]), r, out, w, m.out,
                    alignment_of({at[j] * es, j * r * es, r * 4, m.out * es, w * es}), 1.0f);  // dB_j += s dy_j^T u_j
            }
            add(GemmPass::WeightGrad, "dw A " + mn, in, w, in, w, alignment_of({in * 4, w * es, in * es}),
                1.0f);  // dA += g^T x
            add(GemmPass::InputGrad, "dx " + mn, in, w, in, w, alignment_of({in * es, w * es}),
                whole ? 0.0f : 1.0f);  // dx (+)= g [A..]
            continue;
        }
        for (int j = 0; j < G; ++j) {  // LoraAdapters::forward / backward, one target at a time
            const std::string tn = lora_target_name(present[j]);
            const int64_t out = lora_target_shape(c, present[j])[0];
            for (GemmPass pass : {GemmPass::Forward, GemmPass::Recompute}) {
                if (pass == GemmPass::Recompute && !recomputed(m.op)) continue;
                const std::string pn = pass == GemmPass::Forward ? "fwd " : "recompute ";
                add(pass, pn + "u " + tn, in, r, in, r, alignment_of({r * es, in * es}), 0.0f);
                add(pass, pn + "y " + tn, r, out, r, m.out, alignment_of({at[j] * es, m.out * es, r * es}), y_beta);
            }
            add(GemmPass::InputGrad, "dx g " + tn, r, out, r, m.out, alignment_of({at[j] * es, r * es, m.out * es}),
                0.0f);
            add(GemmPass::WeightGrad, "dw B " + tn, r, out, r, m.out, alignment_of({at[j] * es, r * 4, m.out * es, r * es}),
                1.0f);
            add(GemmPass::WeightGrad, "dw A " + tn, in, r, in, r, alignment_of({in * 4, r * es, in * es}), 1.0f);
            // (the first target writes dx when the adapters cover it; with dropout into a scratch, beta 0)
            add(GemmPass::InputGrad, "dx " + tn, in, r, in, r, alignment_of({in * es, r * es}),
                (whole && j == 0) || o.lora.dropout > 0.0f ? 0.0f : 1.0f);
        }
    }
    return list;
}

double total_flop(const std::vector<StepGemm>& gemms) {
    double f = 0.0;
    for (const StepGemm& g : gemms) f += g.flop();
    return f;
}

}  // namespace qtrain
