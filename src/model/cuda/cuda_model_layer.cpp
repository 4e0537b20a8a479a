// One decoder layer of the GPU model: the block math of each step of the layer program
// (layer_program.h) forward and backward, the recompute as the program's steps filtered by the
// --recompute-* flags, and the roles' per-layer calls (weights, residual offload, gradients), made
// here and nowhere else. The passes (cuda_model_step.cpp) walk the program and call these.
#include "model/cuda/cuda_model.h"

#include "cuda/attention.h"
#include "model/cuda/attention_choice.h"
#include "cuda/fp8.h"
#include "cuda/kernels.h"

namespace qtrain {

CudaModel::BlockDims CudaModel::block_dims(int B, int T) const {
    const ModelConfig& c = config_;
    return {B,
            T,
            B * T,
            c.hidden_size,
            c.q_dim(),
            c.q_dim() + 2 * c.kv_dim(),
            c.intermediate_size,
            static_cast<float>(c.rms_norm_eps),
            attention_shape(c, opt_, B, T, attention_)};
}

void CudaModel::forward_step(int l, const LayerStep& s, StepRun how, const BlockDims& d) {
    const ModelConfig& c = config_;
    const DType A = opt_.model_dtype;
    const GpuLayerOffsets& o = layout_.layers[l];
    GpuLayerActivations& x = buf_.layers[l];
    auto W = [&](int64_t off) { return weights_->at(off); };
    auto bias = [&](int64_t off) { return off < 0 ? nullptr : W(off); };  // an optional bias of the block
    // the forward times each op; the recompute is timed as a whole (recompute_layer)
    auto op_scope = [&](const char* name) { return OpTimer::Scope(how == StepRun::Forward && timer_.enabled() ? &timer_ : nullptr, name, stream_); };
    const int N = d.N, h = d.h;
    switch (s.op) {
        case LayerOp::InputNorm: {
            // The forward adds the previous layer's output (its res_mid + tmp_h, the down projection)
            // into res_in here; layer 0's res_in is the embedding, and the recompute renormalises the
            // stored res_in: both with no delta, which gives the forward's bits.
            const bool add = how == StepRun::Forward && l > 0;
            auto t_ = op_scope("rmsnorm fwd");
            cuda::residual_rmsnorm_forward(A, x.res_in, x.ln1, x.rstd1, add ? buf_.layers[l - 1].res_mid : x.res_in,
                                           add ? buf_.tmp_h : nullptr, W(o.ln1), N, h, d.eps, stream_,
                                           act_amax(l, kQkv));
            return;
        }
        case LayerOp::QkvLinear:  // ln1's amax: from its norm
            linear_fwd(l, kQkv, x.qkv, x.ln1, s.bias ? W(o.qkv_b) : nullptr, N, h, d.qkvd, fp8_);
            return;
        // buf_.doc_positions: null, or the micro-batch's positions (--document-masking): RoPE angles
        // restart and attention stays inside each document
        case LayerOp::Rope: {
            auto t_ = op_scope("rope");
            if (s.qk_norm)  // Qwen3: each head of q and k RMS-normalised first, in the same kernel
                cuda::qk_norm_rope_forward(A, x.qkv, x.qk_pre, x.qk_rstd, W(o.q_norm), W(o.k_norm), buf_.cos_sin, d.B,
                                           d.T, c.num_attention_heads, c.num_key_value_heads, c.head_dim, d.eps,
                                           stream_, buf_.doc_positions);
            else
                cuda::rope_forward(A, x.qkv, buf_.cos_sin, d.B, d.T, c.num_attention_heads, c.num_key_value_heads,
                                   c.head_dim, stream_, buf_.doc_positions);
            return;
        }
        case LayerOp::Attention: {
            auto t_ = op_scope("attention fwd");
            attention_forward(A, x.att, x.lse, x.qkv, d.shape, stream_, act_amax(l, kO), attention_,
                              buf_.attn_workspace, buf_.doc_positions);
            return;
        }
        case LayerOp::OutLinear:  // att's amax: from the attention
            linear_fwd(l, kO, buf_.tmp_h, x.att, bias(o.o_b), N, d.qd, h, fp8_);
            return;
        case LayerOp::PostAttnNorm: {
            // res_mid = res_in + the attention block's output, then its norm; Renorm: the norm of the
            // stored res_mid only
            const bool add = how != StepRun::Renorm;
            auto t_ = op_scope("rmsnorm fwd");
            cuda::residual_rmsnorm_forward(A, x.res_mid, x.ln2, x.rstd2, add ? x.res_in : x.res_mid,
                                           add ? buf_.tmp_h : nullptr, W(o.ln2), N, h, d.eps, stream_,
                                           act_amax(l, kGateUp));
            return;
        }
        case LayerOp::GateUpLinear:
            linear_fwd(l, kGateUp, x.gate_up, x.ln2, bias(o.gate_up_b), N, h, 2 * d.I, fp8_);
            return;
        case LayerOp::Swiglu: {
            auto t_ = op_scope("swiglu");
            cuda::swiglu_forward(A, x.swi, x.gate_up, N, d.I, stream_, act_amax(l, kDown));
            return;
        }
        case LayerOp::DownLinear:
            linear_fwd(l, kDown, buf_.tmp_h, x.swi, bias(o.down_b), N, d.I, h, fp8_);
            return;
    }
}

void CudaModel::backward_step(int l, const LayerStep& s, const BlockDims& d) {
    const ModelConfig& c = config_;
    const DType A = opt_.model_dtype;
    const GpuLayerOffsets& o = layout_.layers[l];
    GpuLayerActivations& x = buf_.layers[l];
    auto W = [&](int64_t off) { return weights_->at(off); };
    auto G = [&](int64_t off) { return param_grad(off); };
    const int N = d.N, h = d.h, I = d.I;
    // an optional bias's gradient: the column sums of its GEMM's dy (before any FP8 rounding of dy);
    // none for a frozen base (LoRA)
    auto bias_grad = [&](int64_t off, const void* dy, int width) {
        if (off < 0 || frozen_base()) return;
        auto t_ = timer_.scope("bias grad", stream_);
        cuda::bias_grad(G(off), buf_.col_scratch, A, dy, N, width, stream_);
    };
    switch (s.op) {
        case LayerOp::DownLinear:  // d_res is d(out of the MLP) and d(res_mid) through the skip connection
            bias_grad(o.down_b, buf_.d_res, h);
            linear_bwd(l, kDown, buf_.d_swi, buf_.d_res, x.swi, N, I, h, fp8_grads_);  // d_res amax: from its norm
            return;
        case LayerOp::Swiglu:
            if (fp8_grads_) {
                // d(gate|up) goes straight into the FP8 operands of the gate|up backward GEMMs: a pass for
                // its amax, then one that recomputes it and writes it quantised (both layouts); the bf16
                // tensor never reaches memory
                {  // (with MLP biases d(gate|up) is also written in bf16, for their gradient; under LoRA
                   // for the gate / up adapters, which read it unquantised)
                    auto t_ = timer_.scope("swiglu", stream_);
                    cuda::swiglu_backward(A, o.gate_up_b < 0 && !lora_ ? nullptr : buf_.d_gu, buf_.d_swi, x.gate_up, N,
                                          I, stream_, grad_amax());
                }
                auto t_ = timer_.scope("fp8 quantize", stream_);
                float* gi = fp8_slot_ptr(fp8_grad_inv_slot(c.num_hidden_layers));
                if (lora_)  // no dW GEMM, so no transpose: quantise the bf16 d(gate|up) just written (one read
                            // instead of d_swi + gate_up; the same codes, as the fused kernel rounds to A first)
                    cuda::quantize_fp8(buf_.dyq, opt_.gradient_dtype, buf_.d_gu, A, static_cast<int64_t>(N) * 2 * I,
                                       grad_amax(), gi, stream_);
                else
                    cuda::swiglu_backward_quantize_transpose(buf_.dyTq, buf_.dyq, opt_.gradient_dtype, buf_.d_swi,
                                                             x.gate_up, A, N, I, grad_amax(), gi, stream_);
            } else {
                auto t_ = timer_.scope("swiglu", stream_);
                cuda::swiglu_backward(A, buf_.d_gu, buf_.d_swi, x.gate_up, N, I, stream_, grad_amax());
            }
            return;
        case LayerOp::GateUpLinear:  // with FP8 gradients the SwiGLU backward wrote dy quantised
            bias_grad(o.gate_up_b, buf_.d_gu, 2 * I);
            if (fp8_grads_)  // (dy: the adapters' bf16 copy under LoRA, else unused)
                linear_bwd(l, kGateUp, buf_.d_ln, lora_ ? buf_.d_gu : nullptr, x.ln2, N, h, 2 * I, true, true);
            else linear_bwd(l, kGateUp, buf_.d_ln, buf_.d_gu, x.ln2, N, h, 2 * I, false);
            return;
        case LayerOp::PostAttnNorm: {  // d_res becomes d(res_mid) = d(o projection) and d(res_in)
            auto t_ = timer_.scope("rmsnorm bwd", stream_);
            cuda::rmsnorm_backward(A, buf_.d_res, G(o.ln2), buf_.col_scratch, buf_.d_ln, x.res_mid, W(o.ln2), x.rstd2,
                                   N, h, stream_, grad_amax());
            return;
        }
        case LayerOp::OutLinear:
            bias_grad(o.o_b, buf_.d_res, h);
            linear_bwd(l, kO, buf_.d_att, buf_.d_res, x.att, N, d.qd, h, fp8_grads_);
            return;
        case LayerOp::Attention: {
            auto t_ = timer_.scope("attention bwd", stream_);
            attention_backward(A, buf_.d_qkv, buf_.d_att, x.qkv, x.att, x.lse, buf_.attn_workspace, d.shape, stream_,
                               opt_.attn_bwd_chunks, attention_, buf_.doc_positions);
            return;
        }
        case LayerOp::Rope: {  // (either kernel leaves the amax of the whole d_qkv for the qkv backward)
            auto t_ = timer_.scope("rope", stream_);
            if (s.qk_norm)
                cuda::qk_norm_rope_backward(A, buf_.d_qkv, G(o.q_norm), G(o.k_norm), buf_.col_scratch, x.qk_pre,
                                            x.qk_rstd, W(o.q_norm), W(o.k_norm), buf_.cos_sin, d.B, d.T,
                                            c.num_attention_heads, c.num_key_value_heads, c.head_dim, stream_,
                                            grad_amax(), buf_.doc_positions);
            else
                cuda::rope_backward(A, buf_.d_qkv, buf_.cos_sin, d.B, d.T, c.num_attention_heads,
                                    c.num_key_value_heads, c.head_dim, stream_, grad_amax(), buf_.doc_positions);
            return;
        }
        case LayerOp::QkvLinear:
            if (s.bias) bias_grad(o.qkv_b, buf_.d_qkv, d.qkvd);
            linear_bwd(l, kQkv, buf_.d_ln, buf_.d_qkv, x.ln1, N, h, d.qkvd, fp8_grads_);  // d_qkv amax: from RoPE
            return;
        case LayerOp::InputNorm: {
            auto t_ = timer_.scope("rmsnorm bwd", stream_);
            cuda::rmsnorm_backward(A, buf_.d_res, G(o.ln1), buf_.col_scratch, buf_.d_ln, x.res_in, W(o.ln1), x.rstd1, N,
                                   h, stream_, grad_amax());  // the next (lower) layer's down-projection dy
            return;
        }
    }
}

// Regenerates the activations of layer l that the recompute flags did not keep: the program's own
// steps on the same inputs, so the backward sees bit-identical values (check_recompute, at
// construction, proves every step it runs finds its inputs).
void CudaModel::recompute_layer(int l, const BlockDims& d) {
    if (!recompute_.any()) return;
    auto t_ = timer_.scope("recompute", stream_);
    for (const LayerStep& s : program_.steps)
        if (const StepRun how = recompute_run(s, recompute_); how != StepRun::Skip) forward_step(l, s, how, d);
}

// ---- the roles' per-layer calls ----

void CudaModel::forward_begin() {
    residuals_->before_write(0);  // the embedding writes layer 0's input residual
}

void CudaModel::layer_enter(int l, Pass p) {
    if (p == Pass::Forward) {
        weights_->gather(l);  // (a no-op but for layer 0: the layer before prefetched it)
        weights_->get(l);
        if (l > 0) residuals_->before_write(l);  // (layer 0's: forward_begin, before the embedding)
        return;
    }
    weights_->gather(l);      // weight streaming: normally already in its slot
    weights_->gather(l - 1);  // prefetch the next layer down
    weights_->get(l);
    residuals_->load(l);      // residual offload: normally already in its slot
    residuals_->load(l - 1);  // prefetch
    residuals_->get(l);
    grads_->begin_layer(l);
}

void CudaModel::layer_input_written(int l) {
    residuals_->written(l);
    if (l > 0) layer_exit(l - 1, Pass::Forward);  // its output was added to the residual in this input norm
    weights_->gather(l + 1);  // prefetch (weight streaming): copied while this layer computes
}

void CudaModel::layer_exit(int l, Pass p) {
    if (p == Pass::Backward) grads_->flush_layer(l);
    weights_->release(l);
}

}  // namespace qtrain
