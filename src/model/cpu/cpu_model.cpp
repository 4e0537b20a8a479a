// CpuModel: options, storage, the training step and the memory plan. The pass itself reads top to
// bottom like the HF Qwen2 forward; the backward walks the same steps in reverse, with one residual
// gradient buffer that every block adds into (the residual connections are identities).
#include "model/cpu/cpu_model.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <tuple>
#include <utility>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/fp8_reference.h"
#include "model/cpu/cpu_head_norm.h"
#include "model/cpu/cpu_ops.h"
#include "model/flag_names.h"

namespace qtrain {

namespace {

// A layer's tensors in the order of CpuModel::Layer's fields (optional ones may be absent).
constexpr const char* kLayerSuffixes[] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias",  "self_attn.k_proj.weight",
    "self_attn.k_proj.bias",  "self_attn.v_proj.weight", "self_attn.v_proj.bias",  "self_attn.o_proj.weight",
    "self_attn.o_proj.bias",  "self_attn.q_norm.weight", "self_attn.k_norm.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",   "mlp.gate_proj.bias",      "mlp.up_proj.weight",     "mlp.up_proj.bias",
    "mlp.down_proj.weight",   "mlp.down_proj.bias"};
constexpr int kLayerFields = sizeof(kLayerSuffixes) / sizeof(kLayerSuffixes[0]);

void ensure(std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

void zero(std::vector<float>& v, int64_t n) { std::fill(v.begin(), v.begin() + n, 0.0f); }

// db[j] += sum over rows of dy[n, j] (a bias gradient taken apart from its GEMM's backward).
void add_bias_grad(float* db, const float* dy, int rows, int width) {
    for (int n = 0; n < rows; ++n)
        for (int j = 0; j < width; ++j) db[j] += dy[static_cast<int64_t>(n) * width + j];
}

using cpu::fake_quantize;  // (cpu_ops.h: the GEMM operands rounded through FP8)

}  // namespace

void CpuModel::check_options(const ModelOptions& o) {
    // FP8 is emulated: e4m3 matmul inputs, optionally e4m3/e5m2 gradients (bf16 gradients with e4m3
    // matmuls mean "not quantised" here, as the CPU keeps them in fp32)
    const bool fp8 = o.matmul_dtype == DType::E4M3;
    const bool fp8_grad = is_fp8(o.gradient_dtype);
    QT_CHECK(!fp8_grad || fp8, flag(&ModelOptions::gradient_dtype), "=", dtype_name(o.gradient_dtype), " needs ",
             flag(&ModelOptions::matmul_dtype), "=e4m3 on ", flag(RunFlag::Device),
             "=cpu (the CPU model emulates FP8 matmuls)");
    const DType matmul = fp8 ? DType::F32 : o.matmul_dtype;
    const DType grad = (fp8 && (fp8_grad || o.gradient_dtype == DType::BF16)) ? DType::F32 : o.gradient_dtype;
    const std::pair<ModelFlag, DType> dtypes[] = {{&ModelOptions::model_dtype, o.model_dtype},
                                                  {&ModelOptions::matmul_dtype, matmul},
                                                  {&ModelOptions::gradient_dtype, grad},
                                                  {&ModelOptions::opt_m_dtype, o.opt_m_dtype},
                                                  {&ModelOptions::opt_v_dtype, o.opt_v_dtype},
                                                  {&ModelOptions::master_dtype, o.master_dtype},
                                                  {&ModelOptions::param_grad_dtype, o.param_grad_dtype}};
    for (const auto& [key, dt] : dtypes)
        QT_CHECK(dt == DType::F32, flag(key), "=", dtype_name(dt), " is not supported yet on ", flag(RunFlag::Device),
                 "=cpu (the CPU reference model runs every role in fp32: use ", flag(key), "=fp32)");
    // GPU settings mean nothing to the CPU model, so each is refused (not ignored; with several ranks
    // --shard-gradients is ZeRO-2 and --shard-weights ZeRO-3, --gpus > 1 in threads mode; the engine
    // refuses --zero-level=2|3 on one CPU rank by that name, run_context.cpp). The recompute
    // flags imply each other (--recompute-block sets all of them), so the widest comes first: the
    // error names the flag the user gave.
    const std::pair<ModelFlag, bool> flags[] = {{&ModelOptions::recompute_block, o.recompute_block},
                                                {&ModelOptions::recompute_ffn, o.recompute_ffn},
                                                {&ModelOptions::recompute_att, o.recompute_att},
                                                {&ModelOptions::recompute_swiglu, o.recompute_swiglu},
                                                {&ModelOptions::recompute_norm, o.recompute_norm},
                                                {&ModelOptions::recompute_qkv, o.recompute_qkv},
                                                {&ModelOptions::offload_residual, o.offload_residual},
                                                {&ModelOptions::offload_master, o.offload_master},
                                                {&ModelOptions::offload_opt_m, o.offload_opt_m},
                                                {&ModelOptions::offload_opt_v, o.offload_opt_v},
                                                {&ModelOptions::offload_quants, o.offload_quants},
                                                {&ModelOptions::offload_gradients, o.offload_gradients},
                                                {&ModelOptions::persistent_quants, o.persistent_quants},
                                                {&ModelOptions::write_combined, o.write_combined},
                                                {&ModelOptions::memcpy_all_gather, o.memcpy_all_gather},
                                                {&ModelOptions::shard_weights, o.shard_weights && o.gpus <= 1},
                                                {&ModelOptions::shard_gradients, o.shard_gradients && o.gpus <= 1},
                                                {&ModelOptions::use_cuda_graphs, o.use_cuda_graphs},
                                                {&ModelOptions::offload_double_buffer, o.offload_double_buffer},
                                                {&ModelOptions::gemm_autotune, o.gemm_autotune},
                                                {&ModelOptions::fp8_fast_accum, o.fp8_fast_accum != Fp8FastAccum::Off},
                                                {&ModelOptions::fp8_transposes_jit, o.fp8_transposes_jit},
                                                {&ModelOptions::attention, o.attention != AttentionImpl::Auto},
                                                {&ModelOptions::attn_bwd_chunks, o.attn_bwd_chunks != 1},
                                                {&ModelOptions::max_docs_per_row, o.max_docs_per_row != 32}};
    for (const auto& [key, on] : flags)
        QT_CHECK(!on, flag(key), " is not supported on ", flag(RunFlag::Device),
                 "=cpu (a GPU setting; the CPU reference model has no use for it)");
    QT_CHECK(!o.fp8_lm_head || fp8, flag(&ModelOptions::fp8_lm_head), "=e4m3 needs ", flag(&ModelOptions::matmul_dtype),
             "=e4m3 (the LM head joins the FP8 matmuls; it is not FP8 on its own)");
    QT_CHECK(o.gpus >= 1, flag(&ModelOptions::gpus), "=", o.gpus, " on ", flag(RunFlag::Device),
             "=cpu: give the number of ranks (threads), at least 1");
    QT_CHECK(o.lmhead_chunks >= 1, flag(&ModelOptions::lmhead_chunks), " must be at least 1, got ", o.lmhead_chunks);
    QT_CHECK(o.batch_size >= 1, flag(&ModelOptions::batch_size), " must be at least 1, got ", o.batch_size);
    QT_CHECK(o.seq_len >= 1, flag(&ModelOptions::seq_len), " must be at least 1, got ", o.seq_len);
}

ModelOptions CpuModel::fp32_options(int batch_size, int seq_len) {
    ModelOptions o;
    o.batch_size = batch_size;
    o.seq_len = seq_len;
    o.model_dtype = o.matmul_dtype = o.gradient_dtype = DType::F32;
    o.opt_m_dtype = o.opt_v_dtype = o.master_dtype = DType::F32;
    return o;
}

CpuModel::CpuModel(const ModelConfig& config, const ModelOptions& options) : config_(config), options_(options) {
    check_options(options);
    config_.validate("model config");
    specs_ = model_parameters(config_);
    int64_t total = 0;
    for (size_t i = 0; i < specs_.size(); ++i) {
        offsets_.push_back(total);
        index_[specs_[i].name] = i;
        total += specs_[i].numel();
    }
    // Every layer's tensors are one contiguous run of specs_ of the same length (layer_range()).
    for (const ParamSpec& p : specs_) tensors_per_layer_ += p.layer == 0;
    for (int l = 0; l < config_.num_hidden_layers; ++l) {
        for (int j = 0; j < tensors_per_layer_; ++j)
            QT_CHECK(specs_[1 + static_cast<size_t>(l) * tensors_per_layer_ + j].layer == l,
                     "CpuModel: unexpected parameter order in layer ", l);
        for (const char* suffix : kLayerSuffixes) {
            auto it = index_.find("model.layers." + std::to_string(l) + "." + suffix);
            layer_offsets_.push_back(it == index_.end() ? -1 : offsets_[it->second]);
        }
    }
    params_.assign(static_cast<size_t>(total), 0.0f);
    lora_ = CpuLora(config_, options_.lora);
    // LoRA: the frozen base has no gradients and no moments (the adapters keep theirs in lora_)
    if (frozen_base()) {
        bind_trained_base();
        lora_.init(options_.lora.seed);  // init_random / load_hf start them again (then --lora-from's)
        return;
    }
    grads_.assign(static_cast<size_t>(total), 0.0f);
    adam_m_.assign(static_cast<size_t>(total), 0.0f);
    adam_v_.assign(static_cast<size_t>(total), 0.0f);
}

float* CpuModel::param(const std::string& name) {
    if (lora_.has(name)) return lora_.param(name);
    return params_.data() + offset(name);
}

float* CpuModel::grad(const std::string& name) {
    if (lora_.has(name)) return lora_.grad(name);
    const int64_t o = offset(name);
    QT_CHECK(!frozen_base(), "CpuModel: '", name, "' is frozen under LoRA (", flag(&LoraOptions::rank),
             "): it has no gradient");
    return grads_.data() + o;
}

float* CpuModel::adam_m(const std::string& name) {
    if (lora_.has(name)) return lora_.adam_m(name);
    const int64_t o = offset(name);
    QT_CHECK(!frozen_base(), "CpuModel: '", name, "' is frozen under LoRA (", flag(&LoraOptions::rank),
             "): it has no Adam moments");
    return adam_m_.data() + o;
}

float* CpuModel::adam_v(const std::string& name) {
    if (lora_.has(name)) return lora_.adam_v(name);
    const int64_t o = offset(name);
    QT_CHECK(!frozen_base(), "CpuModel: '", name, "' is frozen under LoRA (", flag(&LoraOptions::rank),
             "): it has no Adam moments");
    return adam_v_.data() + o;
}

int64_t CpuModel::offset(const std::string& name) const {
    auto it = index_.find(name);
    QT_CHECK(it != index_.end(), "CpuModel: no parameter named '", name, "'");
    return offsets_[it->second];
}

CpuModel::Layer CpuModel::layer(float* base, int l) const {
    const int64_t* o = layer_offsets_.data() + static_cast<int64_t>(l) * kLayerFields;
    float* f[kLayerFields];
    for (int j = 0; j < kLayerFields; ++j) f[j] = o[j] < 0 ? nullptr : base + o[j];
    return {f[0], f[1],  f[2],  f[3],  f[4],  f[5],  f[6],  f[7],  f[8],
            f[9], f[10], f[11], f[12], f[13], f[14], f[15], f[16], f[17]};
}

CpuModel::Layer CpuModel::trained_norm_grads(int l) {
    Layer g{};
    const std::string p = "model.layers." + std::to_string(l) + ".";
    g.ln1 = lora_.trained_grad(p + "input_layernorm.weight");
    g.ln2 = lora_.trained_grad(p + "post_attention_layernorm.weight");
    g.q_norm = lora_.trained_grad(p + "self_attn.q_norm.weight");
    g.k_norm = lora_.trained_grad(p + "self_attn.k_norm.weight");
    return g;
}

const float* CpuModel::lm_head() const {
    return params_.data() + (config_.tie_word_embeddings ? offsets_.front() : offsets_.back());
}

float* CpuModel::lm_head_grad() {
    // LoRA: only with --train-also=embeddings (tied: the embedding's gradient, which the head adds to)
    if (frozen_base()) return lora_.trained_grad(config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    return grads_.data() + (config_.tie_word_embeddings ? offsets_.front() : offsets_.back());
}

void CpuModel::init_random(uint64_t seed) {
    const int64_t total = config_.num_parameters();
    int64_t done = 0;
    for (size_t i = 0; i < specs_.size(); ++i) {
        init_parameter(specs_[i], config_, seed, params_.data() + offsets_[i]);
        report_progress("initialising", done += specs_[i].numel(), total);
    }
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    std::fill(adam_m_.begin(), adam_m_.end(), 0.0f);
    std::fill(adam_v_.begin(), adam_v_.end(), 0.0f);
    step_loss_ = 0.0;
    start_adapters();
    shard_state();  // ZeRO-3: every rank initialised the whole model and keeps its block
}

// ---------------------------------------------------------------------------------------------------
// Activations
// ---------------------------------------------------------------------------------------------------

int64_t CpuModel::activation_floats(const ModelConfig& c, int B, int T, int lmhead_chunks, bool backward) {
    const int64_t N = static_cast<int64_t>(B) * T, C = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(),
                  I = c.intermediate_size, L = c.num_hidden_layers;
    int64_t n = (L + 1) * N * C                                 // resid
                + L * N * (3 * C + 2 * Q + 2 * KV + 3 * I + 2)  // per-layer saved activations
                + L * N * c.num_attention_heads                 // lse
                + N * (2 * C + 2)                               // final norm, tmp, final rstd, losses
                + static_cast<int64_t>(cpu::lmhead_chunk_rows(static_cast<int>(N), lmhead_chunks)) * c.vocab_size +
                static_cast<int64_t>(T) * c.head_dim;  // rope tables
    if (c.qk_norm) n += L * N * (Q + KV + c.num_attention_heads + c.num_key_value_heads);  // pre-norm q|k, rstd
    if (backward) n += N * (2 * C + 2 * Q + 2 * KV + 3 * I);
    return n;
}

void CpuModel::ensure_activations(int B, int T, bool backward) {
    const ModelConfig& c = config_;
    const int64_t N = static_cast<int64_t>(B) * T, C = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(),
                  I = c.intermediate_size, L = c.num_hidden_layers;
    Activations& a = acts_;
    ensure(a.resid, (L + 1) * N * C);
    for (auto* v : {&a.resid_mid, &a.ln1, &a.ln2}) ensure(*v, L * N * C);
    for (auto* v : {&a.rstd1, &a.rstd2}) ensure(*v, L * N);
    for (auto* v : {&a.q, &a.att}) ensure(*v, L * N * Q);
    for (auto* v : {&a.k, &a.v}) ensure(*v, L * N * KV);
    ensure(a.lse, L * N * c.num_attention_heads);
    if (c.qk_norm) {
        ensure(a.q_pre, L * N * Q);
        ensure(a.k_pre, L * N * KV);
        ensure(a.q_rstd, L * N * c.num_attention_heads);
        ensure(a.k_rstd, L * N * c.num_key_value_heads);
    }
    for (auto* v : {&a.gate, &a.up, &a.act}) ensure(*v, L * N * I);
    ensure(a.final_norm, N * C);
    ensure(a.rstd_final, N);
    ensure(a.losses, N);
    ensure(a.logits,
           static_cast<int64_t>(cpu::lmhead_chunk_rows(static_cast<int>(N), options_.lmhead_chunks)) * c.vocab_size);
    if (a.rope_T != T) {
        a.rope_cos.assign(static_cast<size_t>(T) * c.head_dim / 2, 0.0f);
        a.rope_sin.assign(static_cast<size_t>(T) * c.head_dim / 2, 0.0f);
        cpu::rope_tables(a.rope_cos.data(), a.rope_sin.data(), T, c);
        a.rope_T = T;
    }
    // tmp carries the attention / MLP output before the residual add in the forward too.
    ensure(a.tmp, N * C);
    lora_.ensure_activations(static_cast<int>(N));
    if (fp8()) ensure(a.fq_x, static_cast<int64_t>(N) * std::max({C, Q, I}));
    if (!backward) return;
    if (fp8_grads()) ensure(a.fq_dy, static_cast<int64_t>(N) * std::max({C, Q, I}));
    for (auto* v : {&a.dresid, &a.dln}) ensure(*v, N * C);
    for (auto* v : {&a.dq, &a.datt}) ensure(*v, N * Q);
    for (auto* v : {&a.dk, &a.dv}) ensure(*v, N * KV);
    for (auto* v : {&a.dgate, &a.dup, &a.dact}) ensure(*v, N * I);
}

// ---------------------------------------------------------------------------------------------------
// Forward and backward
// ---------------------------------------------------------------------------------------------------

void CpuModel::check_batch(const Batch& b) const {
    QT_CHECK(b.inputs && b.targets, "CpuModel: batch without inputs or targets");
    QT_CHECK(b.batch_size >= 1 && b.seq_len >= 1, "CpuModel: empty batch (", b.batch_size, " x ", b.seq_len, ")");
    const int64_t N = static_cast<int64_t>(b.batch_size) * b.seq_len;
    for (int64_t i = 0; i < N; ++i) {
        QT_CHECK(b.inputs[i] >= 0 && b.inputs[i] < config_.vocab_size, "input token ", b.inputs[i], " at (row ",
                 i / b.seq_len, ", position ", i % b.seq_len, ") is outside the vocabulary (vocab_size ",
                 config_.vocab_size, ")");
        QT_CHECK(b.targets[i] < config_.vocab_size, "target token ", b.targets[i], " at (row ", i / b.seq_len,
                 ", position ", i % b.seq_len, ") is outside the vocabulary (vocab_size ", config_.vocab_size, ")");
    }
    QT_CHECK(b.loss_denominator >= 0.0f, "CpuModel: negative loss_denominator ", b.loss_denominator);
    if (!b.positions) return;
    QT_CHECK(options_.document_masking,
             "CpuModel: the batch carries document positions (packed rows) but the model "
             "was built without document masking (ModelOptions::document_masking, ",
             flag(&ModelOptions::document_masking), ")");
    // a position says where the token's document starts: never before its row
    for (int64_t i = 0; i < N; ++i) {
        const int64_t t = i % b.seq_len;
        QT_CHECK(b.positions[i] >= 0 && b.positions[i] <= t, "CpuModel: position ", b.positions[i], " at (row ",
                 i / b.seq_len, ", token ", t, ") would start its document outside the row (0 <= position <= token)");
    }
}

void CpuModel::forward_to_final_norm(const Batch& batch) {
    const ModelConfig& c = config_;
    const int B = batch.batch_size, T = batch.seq_len, N = B * T, C = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(),
              I = c.intermediate_size, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
    const float eps = static_cast<float>(c.rms_norm_eps);
    Activations& a = acts_;
    {
        const Held table(*this, embedding_range());
        cpu::embedding_forward(a.resid.data(), batch.inputs, params_.data(), N, C);
    }
    // the input of a GEMM: itself, or (FP8) its e4m3 rounding in fq_x
    auto in = [&](const float* x, int64_t n) -> const float* {
        if (!fp8()) return x;
        fake_quantize({{x, a.fq_x.data(), n}}, DType::E4M3);
        return a.fq_x.data();
    };
    for (int l = 0; l < c.num_hidden_layers; ++l) {
        const Held weights(*this, layer_range(l));
        if (fp8()) quantize_layer(l);
        const Layer w = layer(fp8() ? fq_params_.data() : params_.data(), l);
        const Layer wp = layer(params_.data(), l);  // norms and biases are never quantised
        const int64_t nc = static_cast<int64_t>(l) * N * C, nq = static_cast<int64_t>(l) * N * Q,
                      nkv = static_cast<int64_t>(l) * N * KV, ni = static_cast<int64_t>(l) * N * I;
        const float* x = a.resid.data() + nc;
        float *ln1 = a.ln1.data() + nc, *q = a.q.data() + nq, *k = a.k.data() + nkv, *v = a.v.data() + nkv;
        float *att = a.att.data() + nq, *mid = a.resid_mid.data() + nc, *ln2 = a.ln2.data() + nc;
        float *gate = a.gate.data() + ni, *up = a.up.data() + ni, *act = a.act.data() + ni;

        // attention block: x + o_proj(attention(rope(q), rope(k), v))
        cpu::rmsnorm_forward(ln1, a.rstd1.data() + static_cast<int64_t>(l) * N, x, wp.ln1, N, C, eps);
        const float* ln1_in = in(ln1, static_cast<int64_t>(N) * C);
        cpu::matmul_forward(q, ln1_in, w.wq, wp.bq, N, C, Q);
        cpu::matmul_forward(k, ln1_in, w.wk, wp.bk, N, C, KV);
        cpu::matmul_forward(v, ln1_in, w.wv, wp.bv, N, C, KV);
        // LoRA: + s x A^T B^T (nothing without adapters). The adapters read the unquantised input: with
        // an FP8 base (--matmul-dtype=e4m3) only the frozen base's GEMMs are FP8, as on the GPU.
        lora_.forward(l, LoraTarget::Q, q, ln1, N);
        lora_.forward(l, LoraTarget::K, k, ln1, N);
        lora_.forward(l, LoraTarget::V, v, ln1, N);
        if (c.qk_norm) {  // Qwen3: each head of q and k RMS-normalised before RoPE
            float *qp = a.q_pre.data() + nq, *kp = a.k_pre.data() + nkv;
            std::copy(q, q + static_cast<int64_t>(N) * Q, qp);
            std::copy(k, k + static_cast<int64_t>(N) * KV, kp);
            cpu::head_rmsnorm_forward(q, a.q_rstd.data() + static_cast<int64_t>(l) * N * Hq, qp, wp.q_norm,
                                      static_cast<int64_t>(N) * Hq, D, eps);
            cpu::head_rmsnorm_forward(k, a.k_rstd.data() + static_cast<int64_t>(l) * N * Hkv, kp, wp.k_norm,
                                      static_cast<int64_t>(N) * Hkv, D, eps);
        }
        // document masking: positions restart at each document and attention stays inside it
        cpu::rope_forward(q, q, a.rope_cos.data(), a.rope_sin.data(), B, T, Hq, D, batch.positions);
        cpu::rope_forward(k, k, a.rope_cos.data(), a.rope_sin.data(), B, T, Hkv, D, batch.positions);
        cpu::attention_forward(att, a.lse.data() + static_cast<int64_t>(l) * N * Hq, q, k, v, B, T, Hq, Hkv, D,
                               batch.positions);
        cpu::matmul_forward(a.tmp.data(), in(att, static_cast<int64_t>(N) * Q), w.wo, wp.bo, N, Q, C);
        lora_.forward(l, LoraTarget::O, a.tmp.data(), att, N);
        cpu::residual_forward(mid, x, a.tmp.data(), static_cast<int64_t>(N) * C);

        // MLP block: mid + down(silu(gate(ln2)) * up(ln2))
        cpu::rmsnorm_forward(ln2, a.rstd2.data() + static_cast<int64_t>(l) * N, mid, wp.ln2, N, C, eps);
        const float* ln2_in = in(ln2, static_cast<int64_t>(N) * C);
        cpu::matmul_forward(gate, ln2_in, w.wg, wp.bg, N, C, I);
        cpu::matmul_forward(up, ln2_in, w.wu, wp.bu, N, C, I);
        lora_.forward(l, LoraTarget::Gate, gate, ln2, N);
        lora_.forward(l, LoraTarget::Up, up, ln2, N);
        cpu::swiglu_forward(act, gate, up, static_cast<int64_t>(N) * I);
        cpu::matmul_forward(a.tmp.data(), in(act, static_cast<int64_t>(N) * I), w.wd, wp.bd, N, I, C);
        lora_.forward(l, LoraTarget::Down, a.tmp.data(), act, N);
        cpu::residual_forward(a.resid.data() + nc + static_cast<int64_t>(N) * C, mid, a.tmp.data(),
                              static_cast<int64_t>(N) * C);
    }
    const int64_t last = static_cast<int64_t>(c.num_hidden_layers) * N * C;
    const Held norm(*this, norm_range());
    cpu::rmsnorm_forward(a.final_norm.data(), a.rstd_final.data(), a.resid.data() + last,
                         params_.data() + offset("model.norm.weight"), N, C, eps);
}

// Expects acts_.dln to hold d(loss)/d(final_norm output); leaves d(loss)/d(embeddings) in the grads.
void CpuModel::backward_from_final_norm(const Batch& batch) {
    const ModelConfig& c = config_;
    const int B = batch.batch_size, T = batch.seq_len, N = B * T, C = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(),
              I = c.intermediate_size, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
    Activations& a = acts_;
    const int64_t nC = static_cast<int64_t>(N) * C, nQ = static_cast<int64_t>(N) * Q,
                  nKV = static_cast<int64_t>(N) * KV, nI = static_cast<int64_t>(N) * I;
    const int64_t norm_offset = offset("model.norm.weight");

    // dresid carries d(loss)/d(residual stream) downwards; every block adds its input gradient to it.
    zero(a.dresid, nC);
    {
        const Held norm(*this, norm_range());
        float* dnorm = frozen_base() ? lora_.trained_grad("model.norm.weight") : grads_.data() + norm_offset;
        cpu::rmsnorm_backward(a.dresid.data(), dnorm, a.dln.data(),
                              a.resid.data() + static_cast<int64_t>(c.num_hidden_layers) * nC,
                              params_.data() + norm_offset, a.rstd_final.data(), N, C);
    }
    // FP8 gradients: dX = q(dy) q(W), dW += q(dy)^T q(x) with x's forward scale (recomputed: the
    // same amax of the same x), bias gradients from the unquantised dy, as on the GPU.
    const bool fq = fp8_grads();
    const DType gd = options_.gradient_dtype;
    auto xin = [&](const float* x, int64_t n) -> const float* {
        if (!fq) return x;
        fake_quantize({{x, a.fq_x.data(), n}}, DType::E4M3);
        return a.fq_x.data();
    };
    auto dyin = [&](const float* dy, int64_t n) -> const float* {
        if (!fq) return dy;
        fake_quantize({{dy, a.fq_dy.data(), n}}, gd);
        return a.fq_dy.data();
    };
    for (int l = c.num_hidden_layers - 1; l >= 0; --l) {
        const Held weights(*this, layer_range(l));
        // the forward's FP8 copy went with the layer when it was released: the same bits again
        if (fq && weights_sharded()) quantize_layer(l);
        const Layer w = layer(fq ? fq_params_.data() : params_.data(), l);
        const Layer wp = layer(params_.data(), l);
        // LoRA: the frozen base gets no gradient (every pointer null), only the input gradient; with
        // --train-also=norms the norms' gradients go to the adapters' buffers
        const Layer g = frozen_base() ? trained_norm_grads(l) : layer(grads_.data(), l);
        const float* x = a.resid.data() + l * nC;
        const float *ln1 = a.ln1.data() + l * nC, *q = a.q.data() + l * nQ, *k = a.k.data() + l * nKV,
                    *v = a.v.data() + l * nKV, *att = a.att.data() + l * nQ, *mid = a.resid_mid.data() + l * nC,
                    *ln2 = a.ln2.data() + l * nC, *gate = a.gate.data() + l * nI, *up = a.up.data() + l * nI,
                    *act = a.act.data() + l * nI;

        // MLP block
        zero(a.dact, nI);
        {
            if (fq && g.bd) add_bias_grad(g.bd, a.dresid.data(), N, C);  // from the unquantised dy
            const float* dy = dyin(a.dresid.data(), nC);
            cpu::matmul_backward(a.dact.data(), g.wd, fq ? nullptr : g.bd, dy, xin(act, nI), w.wd, N, I, C);
            lora_.backward(l, LoraTarget::Down, a.dact.data(), a.dresid.data(), act, N);  // (unquantised dy)
        }
        zero(a.dgate, nI);
        zero(a.dup, nI);
        cpu::swiglu_backward(a.dgate.data(), a.dup.data(), a.dact.data(), gate, up, nI);
        zero(a.dln, nC);
        // LoRA's gate / up adapters (nothing without them): from the unquantised dy, so with FP8
        // gradients before dy is rounded in place for the base's GEMMs
        auto lora_gate_up = [&] {
            lora_.backward(l, LoraTarget::Gate, a.dln.data(), a.dgate.data(), ln2, N);
            lora_.backward(l, LoraTarget::Up, a.dln.data(), a.dup.data(), ln2, N);
        };
        if (fq) {
            if (g.bg) add_bias_grad(g.bg, a.dgate.data(), N, I);
            if (g.bu) add_bias_grad(g.bu, a.dup.data(), N, I);
            lora_gate_up();
            fake_quantize({{a.dgate.data(), a.dgate.data(), nI}, {a.dup.data(), a.dup.data(), nI}}, gd);
        }
        {
            const float* x2 = xin(ln2, nC);
            cpu::matmul_backward(a.dln.data(), g.wg, fq ? nullptr : g.bg, a.dgate.data(), x2, w.wg, N, C, I);
            cpu::matmul_backward(a.dln.data(), g.wu, fq ? nullptr : g.bu, a.dup.data(), x2, w.wu, N, C, I);
            if (!fq) lora_gate_up();
        }
        cpu::rmsnorm_backward(a.dresid.data(), g.ln2, a.dln.data(), mid, wp.ln2, a.rstd2.data() + l * N, N, C);

        // attention block
        zero(a.datt, nQ);
        {
            if (fq && g.bo) add_bias_grad(g.bo, a.dresid.data(), N, C);
            const float* dy = dyin(a.dresid.data(), nC);
            cpu::matmul_backward(a.datt.data(), g.wo, fq ? nullptr : g.bo, dy, xin(att, nQ), w.wo, N, Q, C);
            lora_.backward(l, LoraTarget::O, a.datt.data(), a.dresid.data(), att, N);
        }
        zero(a.dq, nQ);
        zero(a.dk, nKV);
        zero(a.dv, nKV);
        cpu::attention_backward(a.dq.data(), a.dk.data(), a.dv.data(), a.datt.data(), q, k, v,
                                a.lse.data() + static_cast<int64_t>(l) * N * Hq, B, T, Hq, Hkv, D, batch.positions);
        cpu::rope_backward(a.dq.data(), a.dq.data(), a.rope_cos.data(), a.rope_sin.data(), B, T, Hq, D,
                           batch.positions);
        cpu::rope_backward(a.dk.data(), a.dk.data(), a.rope_cos.data(), a.rope_sin.data(), B, T, Hkv, D,
                           batch.positions);
        if (c.qk_norm) {
            cpu::head_rmsnorm_backward(a.dq.data(), g.q_norm, a.dq.data(), a.q_pre.data() + l * nQ, wp.q_norm,
                                       a.q_rstd.data() + static_cast<int64_t>(l) * N * Hq, static_cast<int64_t>(N) * Hq, D);
            cpu::head_rmsnorm_backward(a.dk.data(), g.k_norm, a.dk.data(), a.k_pre.data() + l * nKV, wp.k_norm,
                                       a.k_rstd.data() + static_cast<int64_t>(l) * N * Hkv, static_cast<int64_t>(N) * Hkv,
                                       D);
        }
        zero(a.dln, nC);
        auto lora_qkv = [&] {  // (as lora_gate_up)
            lora_.backward(l, LoraTarget::Q, a.dln.data(), a.dq.data(), ln1, N);
            lora_.backward(l, LoraTarget::K, a.dln.data(), a.dk.data(), ln1, N);
            lora_.backward(l, LoraTarget::V, a.dln.data(), a.dv.data(), ln1, N);
        };
        if (fq) {
            // bias gradients first, from the unquantised dy; then q|k|v share one gradient scale
            for (auto [dy, db, width] : {std::tuple{a.dq.data(), g.bq, Q}, {a.dk.data(), g.bk, KV}, {a.dv.data(), g.bv, KV}})
                if (db) add_bias_grad(db, dy, N, width);
            lora_qkv();
            fake_quantize({{a.dq.data(), a.dq.data(), nQ}, {a.dk.data(), a.dk.data(), nKV}, {a.dv.data(), a.dv.data(), nKV}},
                          gd);
        }
        {
            const float* x1 = xin(ln1, nC);
            cpu::matmul_backward(a.dln.data(), g.wq, fq ? nullptr : g.bq, a.dq.data(), x1, w.wq, N, C, Q);
            cpu::matmul_backward(a.dln.data(), g.wk, fq ? nullptr : g.bk, a.dk.data(), x1, w.wk, N, C, KV);
            cpu::matmul_backward(a.dln.data(), g.wv, fq ? nullptr : g.bv, a.dv.data(), x1, w.wv, N, C, KV);
            if (!fq) lora_qkv();
        }
        cpu::rmsnorm_backward(a.dresid.data(), g.ln1, a.dln.data(), x, wp.ln1, a.rstd1.data() + l * N, N, C);
    }
    // (reads no weight: the embedding is not gathered again; frozen under LoRA unless --train-also=embeddings)
    float* dembed = frozen_base() ? lora_.trained_grad("model.embed_tokens.weight") : grads_.data();
    if (dembed) cpu::embedding_backward(dembed, a.dresid.data(), batch.inputs, N, C, config_.pad_token_id);
}

void CpuModel::quantize_layer(int l) {
    if (fq_params_.size() != params_.size()) fq_params_.assign(params_.size(), 0.0f);
    const ModelConfig& c = config_;
    const int64_t C = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(), I = c.intermediate_size;
    const Layer w = layer(params_.data(), l), o = layer(fq_params_.data(), l);
    fake_quantize({{w.wq, o.wq, Q * C}, {w.wk, o.wk, KV * C}, {w.wv, o.wv, KV * C}}, DType::E4M3);
    fake_quantize({{w.wo, o.wo, C * Q}}, DType::E4M3);
    fake_quantize({{w.wg, o.wg, I * C}, {w.wu, o.wu, I * C}}, DType::E4M3);
    fake_quantize({{w.wd, o.wd, C * I}}, DType::E4M3);
}

const cpu::LmHeadFp8* CpuModel::quantize_lm_head(cpu::LmHeadFp8& fp8, int N) {
    if (!options_.fp8_lm_head) return nullptr;
    if (fq_params_.size() != params_.size()) fq_params_.assign(params_.size(), 0.0f);
    const int64_t C = config_.hidden_size, V = config_.vocab_size;
    const int64_t head = lm_head() - params_.data();
    fake_quantize({{acts_.final_norm.data(), acts_.fq_x.data(), N * C}}, DType::E4M3);
    fake_quantize({{lm_head(), fq_params_.data() + head, V * C}}, DType::E4M3);
    fp8.xq = acts_.fq_x.data();
    fp8.wq = fq_params_.data() + head;
    fp8.grad = fp8_grads() ? options_.gradient_dtype : DType::F32;
    return &fp8;
}

double CpuModel::mean_loss(const Batch& batch) const {
    const int N = batch.batch_size * batch.seq_len;
    const int valid = cpu::count_valid_targets(batch.targets, N);
    if (valid == 0) return 0.0;  // nothing to predict: no loss (and no gradient)
    double sum = 0.0;
    for (int i = 0; i < N; ++i) sum += acts_.losses[i];
    // the step's normalisation (Batch::loss_denominator), else the micro-batch mean
    if (batch.loss_denominator > 0.0f) return sum / batch.loss_denominator;
    return sum / valid;
}

void CpuModel::forward_backward(const Batch& batch, float grad_scale) {
    check_batch(batch);
    const int N = batch.batch_size * batch.seq_len;
    ensure_activations(batch.batch_size, batch.seq_len, true);
    lora_.begin_pass(true);  // a training pass: LoRA dropout acts (and the pass is counted at its end)
    forward_to_final_norm(batch);
    const int valid = cpu::count_valid_targets(batch.targets, N);
    const float denominator = batch.loss_denominator > 0.0f ? batch.loss_denominator : static_cast<float>(valid);
    const float dscale = valid > 0 ? grad_scale / denominator : 0.0f;
    const int64_t nC = static_cast<int64_t>(N) * config_.hidden_size;
    zero(acts_.dln, nC);
    {
        const Held head(*this, lm_head_range());
        cpu::LmHeadFp8 fp8;
        cpu::lmhead_cross_entropy(acts_.losses.data(), acts_.dln.data(), lm_head_grad(), acts_.final_norm.data(),
                                  lm_head(), batch.targets, N, config_.hidden_size, config_.vocab_size,
                                  options_.lmhead_chunks, dscale, acts_.logits.data(), quantize_lm_head(fp8, N));
    }
    backward_from_final_norm(batch);
    lora_.end_pass();
    step_loss_ += mean_loss(batch) * grad_scale;
}

double CpuModel::evaluate_f64(const Batch& batch) {
    check_batch(batch);
    const int N = batch.batch_size * batch.seq_len;
    ensure_activations(batch.batch_size, batch.seq_len, false);
    lora_.begin_pass(false);
    forward_to_final_norm(batch);
    const Held head(*this, lm_head_range());
    cpu::LmHeadFp8 fp8;
    cpu::lmhead_cross_entropy(acts_.losses.data(), nullptr, nullptr, acts_.final_norm.data(), lm_head(), batch.targets,
                              N, config_.hidden_size, config_.vocab_size, options_.lmhead_chunks, 0.0f,
                              acts_.logits.data(), quantize_lm_head(fp8, N));
    return mean_loss(batch);
}

float CpuModel::evaluate(const Batch& batch) { return static_cast<float>(evaluate_f64(batch)); }

StepStats CpuModel::optimizer_step(const OptimizerParams& p) {
    QT_CHECK(p.step >= 1, "optimizer step must be 1-based, got ", p.step);
    if (comm_ && comm_->world() > 1) return data_parallel_step(p);
    StepStats stats;
    // LoRA: the adapters are all there is to train (the frozen base has no gradient)
    const double squares = frozen_base() ? lora_.grad_sum_squares() : cpu::sum_squares(grads_.data(), num_elements());
    stats.grad_norm = static_cast<float>(std::sqrt(squares));
    stats.loss = static_cast<float>(step_loss_);
    step_loss_ = 0.0;
    if (!update_allowed(stats)) {  // nothing is written from a broken step (imodel.h)
        std::fill(grads_.begin(), grads_.end(), 0.0f);
        lora_.zero_grads();
        return stats;
    }
    // Clip only when the norm exceeds the threshold: scale = clip / norm < 1.
    float clip_scale = 1.0f;
    if (p.grad_clip > 0.0f && stats.grad_norm > p.grad_clip) clip_scale = p.grad_clip / stats.grad_norm;
    if (frozen_base()) {
        lora_.adamw(p, clip_scale);
        return stats;
    }
    for (size_t i = 0; i < specs_.size(); ++i) {
        const int64_t o = offsets_[i];
        cpu::adamw_update(params_.data() + o, grads_.data() + o, adam_m_.data() + o, adam_v_.data() + o,
                          specs_[i].numel(), p.learning_rate, p.beta1, p.beta2, p.epsilon,
                          specs_[i].decay() ? p.weight_decay : 0.0f, clip_scale, p.step);
    }
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    return stats;
}

void CpuModel::zero_gradients() {
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    lora_.zero_grads();
    step_loss_ = 0.0;
}

MemoryPlan CpuModel::plan(const ModelConfig& config, const ModelOptions& options) {
    check_options(options);  // a plan for flags the model would refuse means nothing
    MemoryPlan plan;
    plan.device = "cpu";
    const uint64_t bytes = static_cast<uint64_t>(config.num_parameters()) * sizeof(float);
    plan.add("Weights", bytes);
    if (options.lora.enabled()) {
        // LoRA: the base is frozen (no gradients, no moments); the adapters have all three, and so have
        // the --train-also tensors (CpuLora's buffers hold them all)
        int64_t adapters = 0;
        for (const ParamSpec& s : lora_parameters(config, options.lora)) adapters += s.numel();
        for (const ParamSpec& s : lora_train_also_parameters(config, options.lora)) adapters += s.numel();
        const uint64_t lora_bytes = static_cast<uint64_t>(adapters) * sizeof(float);
        plan.add("LoRA adapters", lora_bytes);
        plan.add("Gradients", lora_bytes);
        plan.add("Adam M", lora_bytes);
        plan.add("Adam V", lora_bytes);
        // x A^T of every adapter for the backward, and its gradient scratch (CpuLora::ensure_activations);
        // with dropout the mask, the dropped input and its gradient ([N, widest input] each)
        const int64_t N = static_cast<int64_t>(options.batch_size) * options.seq_len;
        int64_t floats = (static_cast<int64_t>(config.num_hidden_layers) * kLoraTargets + 1) * N * options.lora.rank;
        if (options.lora.dropout > 0.0f)
            floats += 3 * N * std::max<int64_t>({config.hidden_size, config.q_dim(), config.intermediate_size});
        plan.add("LoRA activations", static_cast<uint64_t>(floats) * sizeof(float));
    } else {
        plan.add("Gradients", bytes);
        plan.add("Adam M", bytes);
        plan.add("Adam V", bytes);
    }
    plan.add("Activations", static_cast<uint64_t>(activation_floats(config, options.batch_size, options.seq_len,
                                                                    options.lmhead_chunks, true)) *
                                sizeof(float));
    return plan;
}

MemoryPlan CpuModel::memory_plan() const { return plan(config_, options_); }

}  // namespace qtrain
