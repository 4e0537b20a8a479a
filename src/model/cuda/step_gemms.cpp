#include "model/cuda/step_gemms.h"

#include <array>
#include <utility>

#include "core/error.h"
#include "model/cuda/gpu_buffers.h"
#include "model/cuda/gpu_layout.h"
#include "model/cuda/layer_program.h"
#include "model/lora.h"

namespace qtrain {

namespace {

struct MatrixShape {
    LayerOp op;
    const char* name;
    int64_t in, out;
    bool bias;
    std::array<LoraTarget, 3> targets;  // the adapters' targets on this matrix (LoraAdapters::writes_whole)
    int n_targets;
};

// Whether LoRA's adapters cover all of a matrix's output without dropout: then (lever 5,
// CudaModel::linear_fwd / linear_bwd) the base GEMM accumulates onto what they wrote (beta = 1), in the
// forward only where the matrix has no bias.
bool lora_writes_whole(const LoraOptions& lora, const MatrixShape& m) {
    if (!lora.enabled() || lora.dropout > 0.0f) return false;
    for (int j = 0; j < m.n_targets; ++j)
        if (!lora.has(m.targets[j])) return false;
    return true;
}

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
    const int64_t h = c.hidden_size, I = c.intermediate_size, q = c.q_dim(), kv = c.kv_dim();
    const int L = c.num_hidden_layers;
    const bool fp8 = o.matmul_dtype == DType::E4M3;   // CudaModel::fp8_
    const bool fp8_grads = fp8 && is_fp8(o.gradient_dtype);  // CudaModel::fp8_grads_
    const bool frozen = o.lora.enabled();
    const bool fast_fwd = o.fp8_fast_accum != Fp8FastAccum::Off, fast_bwd = o.fp8_fast_accum == Fp8FastAccum::All;
    using T = LoraTarget;
    const std::array<MatrixShape, 4> matrices = {{
        {LayerOp::QkvLinear, "qkv", h, q + 2 * kv, c.qkv_bias, {T::Q, T::K, T::V}, 3},
        {LayerOp::OutLinear, "o", q, h, c.o_bias, {T::O}, 1},
        {LayerOp::GateUpLinear, "gate|up", h, 2 * I, c.mlp_bias, {T::Gate, T::Up}, 2},
        {LayerOp::DownLinear, "down", I, h, c.mlp_bias, {T::Down}, 1},
    }};
    // which matrices' forward the backward's recompute runs again: the layer program's choice
    const LayerProgram program = make_layer_program(make_gpu_layout(c));
    const RecomputeSet rc = recompute_set(o);
    auto recomputed = [&](LayerOp op) {
        for (const LayerStep& s : program.steps)
            if (s.op == op) return recompute_run(s, rc) == StepRun::Recompute;
        return false;
    };

    std::vector<StepGemm> list;
    auto add = [&](const MatrixShape& m, GemmPass pass, const std::string& name, int64_t tokens, int calls) {
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
    for (const MatrixShape& m : matrices) {
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
    const MatrixShape head{LayerOp::DownLinear, "lm head", h, c.vocab_size, false, {}, 0};
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

double total_flop(const std::vector<StepGemm>& gemms) {
    double f = 0.0;
    for (const StepGemm& g : gemms) f += g.flop();
    return f;
}

}  // namespace qtrain
