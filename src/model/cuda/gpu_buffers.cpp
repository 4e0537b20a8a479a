#include "model/cuda/gpu_buffers.h"
#include "model/cuda/param_shard.h"

#include <algorithm>

#include "cuda/attention.h"
#include "model/cuda/attention_choice.h"
#include "model/cuda/layer_matrices.h"
#include "cuda/kernels.h"

namespace qtrain {

std::vector<Arena> make_arenas(const ModelOptions& opt) {
    // Index order is what bind_gpu_buffers uses. --offload-master/-opt-m/-opt-v put those categories
    // in pinned, device-mapped host memory that the optimizer reads and writes over PCIe (zero-copy).
    // --shard-weights puts the model-dtype weights there too and streams them through two device
    // layer slots ("Weight slots"); --offload-gradients does the same for the gradients ("Gradient
    // slots", added to the host copy on a side stream). --offload-residual keeps the layers' input
    // residuals there ("Residuals"), two device slots in "Activations". --persistent-quants keeps the
    // FP8 copies of streamed layers ("Persistent quants"), in pinned memory with --offload-quants.
    std::vector<Arena> a;
    for (const char* name : {"Weights", "Master", "Gradients", "Adam M", "Adam V", "Activations", "Workspace"})
        a.push_back(Arena{name, false, nullptr, 0});
    a[0].pinned_host = weights_on_host(opt);
    a[1].pinned_host = opt.offload_master;
    a[2].pinned_host = opt.offload_gradients;
    a[3].pinned_host = opt.offload_opt_m;
    a[4].pinned_host = opt.offload_opt_v;
    a.push_back(Arena{"Host staging", true, nullptr, 0});
    a.push_back(Arena{"Quants", false, nullptr, 0});
    a.push_back(Arena{"Weight slots", false, nullptr, 0});
    a.push_back(Arena{"Gradient slots", false, nullptr, 0});
    a.push_back(Arena{"Residuals", true, nullptr, 0});  // --offload-residual: every layer's input residual
    a.push_back(Arena{"Optimizer staging", false, nullptr, 0});  // --offload-double-buffer
    a.push_back(Arena{"Persistent quants", opt.offload_quants, nullptr, 0});  // streamed FP8 layers' copies
    a.push_back(Arena{"LoRA adapters", false, nullptr, 0});     // --lora-rank: the adapters and their state
    a.push_back(Arena{"LoRA activations", false, nullptr, 0});  // x A^T of every adapter, and scratch
    a.push_back(Arena{"Transpose scratch", false, nullptr, 0});  // the FP8 base's W^T, one matrix at a time
    a.push_back(Arena{"Streamed base", true, nullptr, 0});  // --shard-weights under LoRA: the FP8 base's codes
    return a;
}

bool optimizer_array_on_host(const ModelOptions& o, OptArray a) {
    switch (a) {
        case kOptMaster: return o.offload_master && o.master_dtype == DType::F32 && o.model_dtype != DType::F32;
        case kOptGrads: return o.offload_gradients;
        case kOptM: return o.offload_opt_m;
        case kOptV: return o.offload_opt_v;
        case kOptWeights: return weights_on_host(o);
    }
    return false;
}

bool streamed_quants_persist(const ModelOptions& o) {
    // (a streamed FP8 base is e4m3 codes in host memory already: fp8_base_streamed)
    return is_fp8(o.matmul_dtype) && o.shard_weights && (o.persistent_quants || o.offload_quants) &&
           !o.lora.enabled();
}

bool gradients_reduced_per_layer(const ModelOptions& o) {
    // (LoRA: the frozen base has no gradient; ZeRO-2 there is of the adapters, lora_adapters.h)
    return o.gpus > 1 && o.shard_gradients && !o.use_cuda_graphs && !o.lora.enabled();
}

bool gradients_staged(const ModelOptions& o) {
    return !o.lora.enabled() &&
           (o.offload_gradients || gradients_reduced_per_layer(o) || o.param_grad_dtype == DType::BF16);
}

bool embedding_grad_on_host(const ModelConfig& c, const ModelOptions& o) {
    // (not under ZeRO-2's per-layer reductions: the host copy is then the rank's block only)
    return o.offload_gradients && !c.tie_word_embeddings && !gradients_reduced_per_layer(o);
}

bool embedding_weights_on_host(const ModelConfig& c, const ModelOptions& o) {
    // (not under ZeRO-3: the host copy is then the rank's block only)
    // (nor for the streamed FP8 base, whose embedding is resident with the norms: fp8_base_streamed)
    return o.shard_weights && !c.tie_word_embeddings && !weights_sharded_over_ranks(o) && !fp8_base_only(o);
}

bool weights_sharded_over_ranks(const ModelOptions& o) { return o.shard_weights && o.gpus > 1; }

bool fp8_weights_gathered(const ModelOptions& o) {
    // (LoRA's FP8 base gathers the codes its load made, not codes quantised after each update)
    return weights_sharded_over_ranks(o) && is_fp8(o.matmul_dtype) && is_fp8(o.gradient_dtype) && !o.lora.enabled();
}

bool fp8_base_only(const ModelOptions& o) {
    return o.lora.enabled() && is_fp8(o.matmul_dtype) && is_fp8(o.gradient_dtype);
}

bool fp8_base_transposes_in_backward(const ModelOptions& o) { return fp8_base_only(o) && !o.fp8_base_keep_transposed; }

bool fp8_transposes_just_in_time(const ModelOptions& o) {
    if (fp8_base_only(o)) return fp8_base_transposes_in_backward(o);
    return o.fp8_transposes_jit && fp8_weight_transposes_apply(o);
}

bool fp8_base_streamed(const ModelOptions& o) { return fp8_base_only(o) && o.shard_weights; }

ParamShard fp8_base_block(const GpuParamLayout& layout, int world, int rank) {
    return param_shard(layout.layers_end() - layout.layer_begin(0), world, rank);
}

bool weights_on_host(const ModelOptions& o) {
    // (the streamed FP8 base moves its e4m3 codes only; its model-dtype tensors stay resident)
    return o.shard_weights && (o.gpus <= 1 || o.offload_master) && !fp8_base_only(o);
}

RecomputeSet recompute_set(const ModelOptions& o) {
    RecomputeSet r;
    const bool block = o.recompute_block;
    const bool att = o.recompute_att || block, ffn = o.recompute_ffn || block;
    r.ln1 = r.ln2 = o.recompute_norm || block;
    r.qkv = o.recompute_qkv || att;
    r.att = att;
    r.res_mid = block;
    r.gate_up = ffn;
    r.swi = o.recompute_swiglu || ffn;
    return r;
}

void bind_gpu_buffers(GpuBuffers& b, std::vector<Arena>& arenas, const ModelConfig& c, const ModelOptions& opt,
                      const GpuParamLayout& layout) {
    Arena& weights = arenas[0];
    Arena& master = arenas[1];
    Arena& grads = arenas[2];
    Arena& am = arenas[3];
    Arena& av = arenas[4];
    Arena& act = arenas[5];
    Arena& ws = arenas[6];
    Arena& host = arenas[7];
    Arena& quants = arenas[8];
    Arena& wslots = arenas[9];
    Arena& gslots = arenas[10];
    Arena& residuals = arenas[11];
    Arena& opt_staging = arenas[12];
    Arena& quant_store = arenas[13];
    Arena& lora_state = arenas[14];
    Arena& lora_act = arenas[15];
    Arena& transpose_scratch = arenas[16];
    Arena& base_host = arenas[17];

    const DType A = opt.model_dtype;
    const int64_t P = layout.total;
    const int64_t N = static_cast<int64_t>(opt.batch_size) * opt.seq_len;
    const int64_t h = c.hidden_size, q = c.q_dim(), qkvd = c.q_dim() + 2 * c.kv_dim(), I = c.intermediate_size;
    const int L = c.num_hidden_layers;

    // Data parallel (--gpus=N, param_shard.h): each rank keeps the master and Adam's moments of its
    // block only; the weights and gradients the collectives move are padded to N equal blocks (at
    // N = 1 nothing changes). --master-dtype=bf16: no fp32 copy, the bf16 weights are what AdamW
    // updates; an fp32 model's master is its weights, so it stays whole.
    const int world = std::max(1, opt.gpus);
    const ParamShard shard = param_shard(P, world, 0);
    // LoRA: the frozen base is its model-dtype weights only (resident, or streamed from the host on one
    // GPU; under ZeRO-3 the rank's block of them, as the full model's, or for the FP8 base the rank's
    // block of its layers' codes: fp8_base_block)
    const bool frozen = opt.lora.enabled();
    const int64_t Pp = shard.padded_total(), owned = frozen ? 0 : world > 1 ? shard.size : P;
    b.master = frozen ? nullptr
               : opt.master_dtype == DType::F32 ? master.take_n<float>(A == DType::F32 ? Pp : owned)
                                                : nullptr;
    // (ZeRO-3 needs --model-dtype=bf16, check_options: the block is never an fp32 master)
    b.weights = fp8_base_only(opt)                ? weights.take_typed(layout.compact_total(), A)  // no matrices
                : weights_sharded_over_ranks(opt) ? weights.take_typed(shard.size, A)  // ZeRO-3: the block
                : frozen                          ? weights.take_typed(Pp, A)
                : (A == DType::F32)               ? static_cast<void*>(b.master)
                                                  : weights.take_typed(Pp, A);
    const bool per_layer = gradients_reduced_per_layer(opt);
    b.grads = frozen ? nullptr : grads.take_typed(per_layer ? shard.size : Pp, opt.param_grad_dtype);
    const int64_t span = layout.layer_span;
    const int64_t non_layer = P - (layout.layers_end() - layout.layer_begin(0));
    if (opt.shard_weights && !fp8_base_only(opt)) {  // (the FP8 base streams its codes only: below)
        b.resident_weights = wslots.take_typed(
            embedding_weights_on_host(c, opt) ? layout.total - layout.layers_end() : non_layer, A);
        for (void*& s : b.weight_slots) s = wslots.take_typed(span, A);
    }
    if (gradients_staged(opt)) {
        b.resident_grads = gslots.take_n<float>(embedding_grad_on_host(c, opt) ? layout.total - layout.layers_end()
                                                                                : non_layer);
        for (float*& s : b.grad_slots) s = gslots.take_n<float>(span);
    }
    if (per_layer) b.grad_reduce_tmp = gslots.take_n<float>(span);
    b.opt.adam_m = am.take_typed(owned, opt.opt_m_dtype);
    b.opt.adam_v = av.take_typed(owned, opt.opt_v_dtype);
    b.opt.elements = owned;
    if (opt.offload_double_buffer) {
        b.opt.chunk = std::min<int64_t>(opt.optimizer_chunk, (owned + 63) / 64 * 64);
        const DType types[5] = {DType::F32, opt.param_grad_dtype, opt.opt_m_dtype, opt.opt_v_dtype, A};
        for (int a = 0; a < 5; ++a)
            if (optimizer_array_on_host(opt, static_cast<OptArray>(a)))
                for (void*& s : b.opt.stage[a]) s = opt_staging.take_typed(b.opt.chunk, types[a]);
    }

    // A recomputed activation gets one buffer for all layers (taken by its first layer; pointers are
    // null while measuring, so "taken" is tracked separately).
    const RecomputeSet rc = recompute_set(opt);
    b.layers.assign(L, {});
    struct Shared {
        void* p = nullptr;
        bool taken = false;
    };
    Shared s_ln1, s_qkv, s_qk_pre, s_qk_rstd, s_att, s_lse, s_res_mid, s_ln2, s_gate_up, s_swi;
    auto slot = [&](bool recomputed, Shared& sh, std::size_t bytes) {
        if (!recomputed) return act.take(bytes);
        if (!sh.taken) sh.p = act.take(bytes), sh.taken = true;
        return sh.p;
    };
    const std::size_t es = dtype_size(A);
    // FP8 gradients: each matrix input that is not recomputed is kept quantised and transposed
    // (xT) for the backward's weight-gradient GEMM. ln1, ln2 and the SwiGLU output are then needed
    // in bf16 only inside the forward (and ln1 / ln2 by a backward recompute of the QKV / gate|up
    // projection from them), so they share one buffer across layers like recomputed activations.
    // LoRA's frozen FP8 base has no weight-gradient GEMM, so no xT: the adapters' backward reads the
    // model-dtype inputs instead (kept per layer).
    const bool fp8_grads = is_fp8(opt.matmul_dtype) && is_fp8(opt.gradient_dtype);
    const bool keep_xT_any = fp8_grads && !frozen;
    const bool keep_xT[4] = {keep_xT_any && !rc.ln1, keep_xT_any && !rc.att, keep_xT_any && !rc.ln2,
                             keep_xT_any && !rc.swi};
    const int64_t x_dims[4] = {h, q, h, I};
    const bool ln1_shared = rc.ln1 || (keep_xT[0] && !rc.qkv);
    const bool ln2_shared = rc.ln2 || (keep_xT[2] && !rc.gate_up);
    const bool swi_shared = rc.swi || keep_xT[3];
    if (opt.offload_residual) {
        b.res_host = residuals.take_typed(static_cast<std::size_t>(L) * N * h, A);
        for (void*& s : b.res_slots) s = act.take_typed(N * h, A);
    }
    for (int l = 0; l < L; ++l) {
        GpuLayerActivations& x = b.layers[l];
        x.res_in = opt.offload_residual ? b.res_slots[l & 1] : act.take_typed(N * h, A);
        x.ln1 = slot(ln1_shared, s_ln1, N * h * es);
        x.rstd1 = act.take_n<float>(N);
        x.qkv = slot(rc.qkv, s_qkv, N * qkvd * es);
        if (c.qk_norm) {
            const int64_t heads = c.num_attention_heads + c.num_key_value_heads;
            x.qk_pre = slot(rc.qkv, s_qk_pre, N * heads * c.head_dim * es);
            x.qk_rstd = static_cast<float*>(slot(rc.qkv, s_qk_rstd, static_cast<std::size_t>(N) * heads * 4));
        }
        x.att = slot(rc.att, s_att, N * q * es);
        x.lse = static_cast<float*>(slot(rc.att, s_lse, static_cast<std::size_t>(N) * c.num_attention_heads * 4));
        x.res_mid = slot(rc.res_mid, s_res_mid, N * h * es);
        x.ln2 = slot(ln2_shared, s_ln2, N * h * es);
        x.rstd2 = act.take_n<float>(N);
        x.gate_up = slot(rc.gate_up, s_gate_up, N * 2 * I * es);
        x.swi = slot(swi_shared, s_swi, N * I * es);
        for (int m = 0; m < 4; ++m)
            if (keep_xT[m]) x.xT[m] = act.take(static_cast<std::size_t>(N) * x_dims[m]);
    }
    b.res_final = act.take_typed(N * h, A);
    b.xf = act.take_typed(N * h, A);
    b.rstd_final = act.take_n<float>(N);

    b.tmp_h = ws.take_typed(N * h, A);
    b.d_res = ws.take_typed(N * h, A);
    b.d_ln = ws.take_typed(N * h, A);
    b.d_qkv = ws.take_typed(N * qkvd, A);
    b.d_att = ws.take_typed(N * q, A);
    b.d_swi = ws.take_typed(N * I, A);
    // with FP8 gradients d(gate|up) goes straight into FP8 (swiglu_backward_quantize_transpose), unless
    // the MLP has biases, whose gradient is summed from it, or LoRA's gate / up adapters read it
    b.d_gu = fp8_grads && !c.mlp_bias && !frozen ? nullptr : ws.take_typed(N * 2 * I, A);
    b.lmhead_chunk_rows = static_cast<int>((N + opt.lmhead_chunks - 1) / opt.lmhead_chunks);
    b.logits = ws.take_typed(static_cast<std::size_t>(b.lmhead_chunk_rows) * c.vocab_size, A);
    b.losses = ws.take_n<float>(N);
    // the widest bias gradient: q|k|v's, o_proj's / down_proj's (h), gate|up's (2I)
    const int widest = static_cast<int>(std::max({qkvd, c.o_bias || c.mlp_bias ? h : 0, c.mlp_bias ? 2 * I : 0}));
    std::size_t col = std::max({cuda::bias_grad_scratch_floats(static_cast<int>(N), widest),
                                cuda::rmsnorm_backward_scratch_floats(static_cast<int>(N), static_cast<int>(h))});
    if (c.qk_norm)
        col = std::max(col, cuda::qk_norm_rope_backward_scratch_floats(opt.batch_size, opt.seq_len, c.num_attention_heads,
                                                                      c.num_key_value_heads, c.head_dim));
    b.col_scratch = ws.take_n<float>(col);
    b.norm_partials = ws.take_n<float>(static_cast<std::size_t>(cuda::norm_partials_count()) * world);
    b.rank_losses = ws.take_n<float>(world);
    b.norm_out = ws.take_n<float>(4);
    b.loss_acc = ws.take_n<float>(4);
    b.cos_sin = ws.take_n<float>(static_cast<std::size_t>(opt.seq_len) * c.head_dim);
    const AttentionBackend attention = choose_attention_backend(c, opt);
    const AttentionShape shape = attention_shape(c, opt, opt.batch_size, opt.seq_len, attention);
    b.attn_workspace_bytes =  // for B/chunks sequences (cuDNN with document masking: + its ragged index)
        attention_backward_workspace_bytes(A, shape, opt.attn_bwd_chunks, attention);
    b.attn_workspace = b.attn_workspace_bytes ? ws.take(b.attn_workspace_bytes) : nullptr;
    b.inputs = ws.take_n<int32_t>(N);
    b.targets = ws.take_n<int32_t>(N);
    b.emb_unique = ws.take_n<int32_t>(N);
    b.emb_offsets = ws.take_n<int32_t>(N + 1);
    b.emb_positions = ws.take_n<int32_t>(N);
    if (opt.document_masking) b.doc_positions = ws.take_n<int32_t>(N);
    b.opt.num_segments = frozen ? 0 : static_cast<int>(layout.specs.size());
    b.opt.segments = ws.take(sizeof(cuda::ParamSegment) * b.opt.num_segments);

    b.step_scalars = ws.take_n<float>(4);
    if (frozen) {
        const LoraLayout ly = make_lora_layout(c, opt.lora);
        LoraBuffers& l = b.lora;
        // --gpus=N: each rank keeps the master and moments of its block of the adapters' flat space
        // (param_shard.h, ZeRO-1/2 of the adapters); the gradient the backward accumulates and the
        // model-dtype weights the GEMMs read are whole, padded to N blocks for the collectives (and
        // an fp32 model's weights are then a copy of their own: the master is a block). At one GPU
        // the block is the whole space and the weights of an fp32 model are the master.
        const ParamShard sh = param_shard(ly.total, world, 0);
        l.master = lora_state.take_n<float>(sh.size);
        l.grads = lora_state.take_n<float>(sh.padded_total());
        l.weights = A == DType::F32 && world == 1 ? static_cast<void*>(l.master)
                                                  : lora_state.take_typed(sh.padded_total(), A);
        l.opt.adam_m = lora_state.take_n<float>(sh.size);
        l.opt.adam_v = lora_state.take_n<float>(sh.size);
        l.opt.elements = sh.size;
        l.opt.num_segments = static_cast<int>(ly.specs.size());
        l.opt.segments = lora_state.take(sizeof(cuda::ParamSegment) * ly.specs.size());
        l.pass = lora_state.take_n<uint64_t>(1);
        const int64_t r = opt.lora.rank;
        l.saved = lora_act.take_typed(static_cast<std::size_t>(ly.slots) * N * r, A);
        l.dh = lora_act.take_typed(N * r * ly.widest_stack, A);  // g of one target, or of a stacked matrix
        if (opt.lora.dropout > 0.0f) {
            l.xd = lora_act.take_typed(N * ly.widest_input, A);
            l.dxd = lora_act.take_typed(N * ly.widest_input, A);
        }
    }

    if (is_fp8(opt.matmul_dtype)) {
        const bool jit = fp8_transposes_just_in_time(opt);
        if (fp8_base_only(opt)) {  // LoRA's FP8 base: the layers' span only (the head's below)
            const int64_t layers_n = layout.layers_end() - layout.layer_begin(0);
            if (opt.shard_weights) {  // streamed (fp8_base_streamed): two device slots the layers pass through
                // ZeRO-3: the rank's block of the codes on the device (fp8_base_block); one GPU: all on the host
                b.wq = weights_sharded_over_ranks(opt) ? quants.take(fp8_base_block(layout, world, 0).size)
                                                       : base_host.take(layers_n);
                for (void*& s : b.quant_slots) s = wslots.take(span);
            } else {
                b.wq = quants.take(layers_n);
            }
            if (fp8_grads && !jit) b.wTq = quants.take(layers_n);  // (the test-only fp8_base_keep_transposed)
        } else if (opt.shard_weights) {  // quantised as each layer arrives in its slot
            for (int s = 0; s < 2; ++s) {
                b.quant_slots[s] = quants.take(span);
                if (fp8_grads && !jit) b.quantT_slots[s] = quants.take(span);
            }
            if (streamed_quants_persist(opt)) b.quant_store = quant_store.take(static_cast<std::size_t>(L) * span);
            if (fp8_weights_gathered(opt)) {  // ZeRO-3: the block's FP8 codes and every rank's abs-maxes
                b.quant_block = quants.take(shard.size);
                b.rank_amax = quants.take_n<float>(static_cast<std::size_t>(world) * 4 * L);
            }
        } else {
            b.wq = quants.take(P);
            if (fp8_grads && !jit) b.wTq = quants.take(P);
        }
        if (jit) {  // W^T one matrix at a time, made by the backward (fp8_transposes_just_in_time)
            int64_t largest = 0;
            for (int m = 0; m < 4; ++m) {
                const MatrixShape g = layer_matrix(layout, c, 0, static_cast<Matrix>(m));
                largest = std::max(largest, g.rows * g.cols);
            }
            b.wT_scratch = transpose_scratch.take(largest);
        }
        const bool head = opt.fp8_lm_head;  // --lm-head-dtype=e4m3 (gpu_buffers.h)
        const std::size_t head_n = static_cast<std::size_t>(c.vocab_size) * h;
        if (head && (opt.shard_weights || fp8_base_only(opt))) {  // the resident head's FP8 copies (resident weights: in wq / wTq)
            b.lm_wq = quants.take(head_n);
            if (fp8_grads) b.lm_wTq = quants.take(head_n);
        } else if (head && fp8_grads && jit) {  // resident, its row-major copy in wq; no wTq to hold its transpose
            b.lm_wTq = quants.take(head_n);
        }
        // the LM head has a weight gradient: the full model's, or LoRA's with --train-also=embeddings
        const bool head_dw = !frozen || (opt.lora.train_also & kTrainEmbeddings);
        if (head && fp8_grads) {  // one chunk's d(logits) in FP8, row-major and transposed
            const std::size_t chunk = static_cast<std::size_t>(b.lmhead_chunk_rows) * c.vocab_size;
            b.lm_dyq = ws.take(chunk);
            if (head_dw) b.lm_dyTq = ws.take(chunk);  // (the dW GEMM's operand only)
        }
        b.fp8_scales =
            ws.take_n<float>(4 * static_cast<std::size_t>(L * kFp8SlotsPerLayer + 2 + (head ? kFp8HeadSlots : 0)));
        b.weight_amax = ws.take_n<float>(4 * 4 * static_cast<std::size_t>(L));
        const int64_t x_max = std::max({h, q, I});
        b.xq = ws.take(N * x_max);
        if (fp8_grads) {
            const int64_t dy_max = std::max({qkvd, h, 2 * I});
            // (x re-quantised for dW; the LM head's dW too: LoRA's trained head needs a chunk's rows of it)
            if (!frozen) b.xTq = ws.take(N * x_max);
            else if (head && head_dw) b.xTq = ws.take(static_cast<std::size_t>(b.lmhead_chunk_rows) * h);
            b.dyq = ws.take(N * dy_max);
            if (!frozen) b.dyTq = ws.take(N * dy_max);  // (dy^T: the dW GEMM's operand only)
        }
    }
    b.host_staging = host.take_n<int32_t>(5 * N + 1 + 4 + (opt.document_masking ? N : 0));
}

MemoryPlan gpu_memory_plan(const ModelConfig& cfg, const ModelOptions& opt, const std::string& device_name) {
    GpuParamLayout layout = make_gpu_layout(cfg);
    std::vector<Arena> arenas = make_arenas(opt);
    GpuBuffers b;
    bind_gpu_buffers(b, arenas, cfg, opt, layout);
    MemoryPlan plan;
    plan.device = device_name;
    for (const Arena& a : arenas) {
        if (a.used == 0 && (a.category == "Quants" || a.category == "Weight slots" || a.category == "Gradient slots" ||
                            a.category == "Residuals" || a.category == "Optimizer staging" ||
                            a.category == "Persistent quants" || a.category == "LoRA adapters" ||
                            a.category == "LoRA activations" || a.category == "Transpose scratch" ||
                            a.category == "Streamed base"))
            continue;  // no FP8, no streaming, no residual offload, ...
        if (a.pinned_host) plan.add(a.category, 0, a.used);
        else plan.add(a.category, a.used + (a.category == "Workspace" ? kGemmWorkspaceBytes : 0));
    }
    return plan;
}

}  // namespace qtrain
