// The model's linear layers: each of a layer's four matrices as a bf16 GEMM or, with
// --matmul-dtype=e4m3, as an FP8 GEMM on operands quantised with their current per-tensor scale
// (docs/design.md, "Precision"). The weights' FP8 copies are the weights role's (weights.h). Under
// LoRA with e4m3 the frozen base runs here as an FP8 base: its GEMMs FP8 (no dW), its adapters not.
#include "model/cuda/cuda_model.h"

#include <array>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/fp8.h"
#include "cuda/gemm.h"

namespace qtrain {

float* CudaModel::act_amax(int l, Matrix m) const {
    return fp8_ ? fp8_slot_ptr(fp8_slot(l, Fp8Slot::ActAmax, m)) : nullptr;
}

float* CudaModel::grad_amax() const {
    return fp8_grads_ ? fp8_slot_ptr(fp8_grad_amax_slot(config_.num_hidden_layers)) : nullptr;
}

void CudaModel::linear_fwd(int l, Matrix m, void* y, const void* x, const void* bias, int N, int in, int out,
                           bool amax_ready) {
    const DType A = opt_.model_dtype;
    const int64_t off = matrix(l, m).offset;
    // LoRA: y += s drop(x) A^T B^T on each target's slice, after the base GEMM; or, where the adapters
    // cover all of y without dropout, before it: they write y and the base GEMM adds onto it (beta = 1).
    // Not with a bias (Qwen2's q|k|v): an FP8 GEMM with both a bias and beta = 1 has not yet run on the
    // GPU (Fp8Gemm.ForwardAndInputGradientAccumulateOntoABf16Output checks it; q|k|v is ~9% of y)
    const bool first = lora_ && bias == nullptr && lora_writes_whole(l, m);
    if (first) lora_fwd(l, m, y, x, N, out, true);
    const float beta = first ? 1.0f : 0.0f;
    if (!fp8_) {
        {
            auto t_ = timer_.scope("gemm fwd", stream_);
            gemm_->linear_forward(y, A, x, weights_->at(off), A, bias, N, in, out, stream_, beta);
        }
        if (lora_ && !first) lora_fwd(l, m, y, x, N, out, false);
        return;
    }
    float* xa = fp8_slot_ptr(fp8_slot(l, Fp8Slot::ActAmax, m));
    float* xi = fp8_slot_ptr(fp8_slot(l, Fp8Slot::ActInv, m));
    {
        auto t_ = timer_.scope("fp8 quantize", stream_);
        if (!amax_ready) cuda::abs_max(xa, A, x, static_cast<int64_t>(N) * in, stream_);
        if (void* xT = keep_xT_ ? buf_.layers[l].xT[m] : nullptr)  // the backward's copy in the same pass
            cuda::quantize_fp8_transpose(xT, DType::E4M3, x, A, N, in, xa, xi, stream_, buf_.xq);
        else
            cuda::quantize_fp8(buf_.xq, DType::E4M3, x, A, static_cast<int64_t>(N) * in, xa, xi, stream_);
    }
    {
        auto t_ = timer_.scope("gemm fwd", stream_);
        gemm_->linear_forward_fp8(y, A, buf_.xq, DType::E4M3, xi, weights_->q(off), DType::E4M3,
                                  weights_->inv_scale(l, m), bias, N, in, out, stream_, beta,
                                  opt_.fp8_fast_accum != Fp8FastAccum::Off);
    }
    // LoRA on the FP8 base: the adapters read the unquantised x, in the model dtype
    if (lora_ && !first) lora_fwd(l, m, y, x, N, out, false);
}

void CudaModel::linear_bwd(int l, Matrix m, void* dx, const void* dy, const void* x, int N, int in, int out,
                           bool amax_ready, bool dy_quantized) {
    const DType A = opt_.model_dtype;
    const int64_t off = matrix(l, m).offset;
    // LoRA, a frozen base: no weight gradient; the adapters' gradients and their part of dx, after the
    // base's input-gradient GEMM, or (covering all of dx, no dropout) before it, which then adds onto it
    const bool first = lora_ && lora_writes_whole(l, m);
    const float beta = first ? 1.0f : 0.0f;
    if (!fp8_grads_) {
        const void* w = weights_->at(off);
        if (first) lora_bwd(l, m, dx, dy, x, N, out, true);
        {
            auto t_ = timer_.scope("gemm bwd dx", stream_);
            gemm_->linear_backward_input(dx, A, dy, w, A, N, in, out, stream_, beta);
        }
        if (lora_) {
            if (!first) lora_bwd(l, m, dx, dy, x, N, out, false);
            return;
        }
        float* dw = grads_->at(off);
        auto t_ = timer_.scope("gemm bwd dw", stream_);
        gemm_->linear_backward_weight(dw, DType::F32, dy, x, A, N, in, out, !grads_->matrices_written_whole(), stream_);
        return;
    }
    // (LoRA: the frozen FP8 base has no weight gradient, so no x^T either; dy in the model dtype is
    // what its adapters read)
    float* dw = lora_ ? nullptr : grads_->at(off);
    const DType gd = opt_.gradient_dtype;
    const int L = config_.num_hidden_layers;
    float* ga = fp8_slot_ptr(fp8_grad_amax_slot(L));
    float* gi = fp8_slot_ptr(fp8_grad_inv_slot(L));
    // x^T: kept by the training forward, or (recomputed input) quantised again with the forward's
    // scale, which gives the same codes
    const void* xT = buf_.layers[l].xT[m];
    {
        auto t_ = timer_.scope("fp8 quantize", stream_);
        if (!dy_quantized) {
            if (!amax_ready) cuda::abs_max(ga, A, dy, static_cast<int64_t>(N) * out, stream_);
            // (LoRA: no dW GEMM, so no dy^T (gpu_buffers.cpp allocates none); the row-major codes and
            // the inverse scale are the ones quantize_fp8_transpose writes: same scale and encoding)
            if (lora_) cuda::quantize_fp8(buf_.dyq, gd, dy, A, static_cast<int64_t>(N) * out, ga, gi, stream_);
            else cuda::quantize_fp8_transpose(buf_.dyTq, gd, dy, A, N, out, ga, gi, stream_, buf_.dyq);
        }
        if (!xT && !lora_) {
            cuda::quantize_fp8_transpose(buf_.xTq, DType::E4M3, x, A, N, in,
                                         fp8_slot_ptr(fp8_slot(l, Fp8Slot::ActAmax, m)), nullptr, stream_);
            xT = buf_.xTq;
        }
    }
    if (first) lora_bwd(l, m, dx, dy, x, N, out, true);
    // W^T: kept, or for the FP8 base transposed now into its scratch (weights.h; timed apart from the GEMM)
    const void* wT = weights_->transposed(l, m);
    {
        auto t_ = timer_.scope("gemm bwd dx", stream_);
        gemm_->linear_backward_input_fp8(dx, A, buf_.dyq, gd, gi, wT,
                                         DType::E4M3, weights_->inv_scale(l, m), N, in, out,
                                         stream_, beta, opt_.fp8_fast_accum == Fp8FastAccum::All);
    }
    if (lora_) {
        if (!first) lora_bwd(l, m, dx, dy, x, N, out, false);
        return;
    }
    auto t_ = timer_.scope("gemm bwd dw", stream_);
    gemm_->linear_backward_weight_fp8(dw, DType::F32, buf_.dyTq, gd, gi, xT, DType::E4M3,
                                      fp8_slot_ptr(fp8_slot(l, Fp8Slot::ActInv, m)), N, in, out,
                                      !grads_->matrices_written_whole(), stream_,
                                      opt_.fp8_fast_accum == Fp8FastAccum::All);
}

bool CudaModel::lora_writes_whole(int l, Matrix m) const {
    const MatrixLoraTargets s = matrix_lora_targets(config_, m);
    return lora_->writes_whole(l, s.targets.data(), s.n);
}

void CudaModel::lora_fwd(int l, Matrix m, void* y, const void* x, int N, int out, bool write) {
    const MatrixLoraTargets s = matrix_lora_targets(config_, m);
    lora_->forward_matrix(l, s.targets.data(), s.cols.data(), s.n, y, out, x, N, lora_training_, write);
}

void CudaModel::lora_bwd(int l, Matrix m, void* dx, const void* dy, const void* x, int N, int out, bool write) {
    const MatrixLoraTargets s = matrix_lora_targets(config_, m);
    lora_->backward_matrix(l, s.targets.data(), s.cols.data(), s.n, dx, dy, out, x, N, write);
}

float* CudaModel::param_grad(int64_t off) const {
    if (!frozen_base()) return grads_->at(off);
    QT_CHECK(layout_.layer_of(off) < 0 || !layout_.in_matrix(off),
             "GPU model: internal error (a frozen base matrix's gradient was asked for)");
    const auto it = trained_grads_.find(off);
    return it == trained_grads_.end() ? nullptr : it->second;
}

// ---------------------------------------------------------------------------------------------

}  // namespace qtrain
