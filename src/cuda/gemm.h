// Matrix products through cuBLASLt, with the matmul descriptor, layouts and the chosen algorithm
// cached per shape (a training step repeats the same few dozen shapes thousands of times).
//
// All tensors are row-major, as the model stores them; the row-major helpers below map each product
// to cuBLAS's column-major view (a row-major [r, c] matrix is a column-major [c, r] one):
//   forward       y[N,out]   = x[N,in] · W[out,in]^T (+ bias)   -> TN, m=out n=N k=in
//   input grad    dx[N,in]   = dy[N,out] · W[out,in]            -> NN, m=in  n=N k=out
//   weight grad   dW[out,in] (+)= dy[N,out]^T · x[N,in]         -> NT, m=in  n=out k=N
// TN is also the layout cuBLASLt's FP8 kernels require (A transposed, B not: both operands K-major),
// so the FP8 helpers take operands already laid out that way (quantize_fp8_transpose makes them):
//   forward       y[N,out]   = xq[N,in] · wq[out,in]^T (+ bias)     -> TN, m=out n=N  k=in
//   input grad    dx[N,in]   = dyq[N,out] · wTq[in,out]^T          -> TN, m=in  n=N  k=out
//   weight grad   dW[out,in] (+)= dyTq[out,N] · xTq[in,N]^T        -> TN, m=in  n=out k=N
// FP8 operands come with device pointers to their fp32 dequantisation factors (cuda/fp8.h: inv =
// amax / fmax, each in its own 16-byte slot); cuBLASLt computes D = a_scale * b_scale * (A·B)
// (+ beta * C) (+ bias). Supported (cuBLASLt): e4m3×e4m3, e4m3×e5m2, e5m2×e4m3 (not e5m2×e5m2);
// D bf16 (C bf16) or fp32 (C fp32, so beta = 1 accumulates into an fp32 weight gradient); bias bf16
// for either output type. k, m, lda, ldb must be multiples of 16, ldc * sizeof(C) a multiple of 16
// bytes, and A, B, C (bias) pointers 16-byte aligned: run() checks and says which one is off.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace qtrain {

struct GemmOp {
    bool trans_a = false, trans_b = false;  // column-major op(A), op(B)
    int64_t m = 0, n = 0, k = 0;            // C is m x n column-major
    const void* a = nullptr;
    DType a_type = DType::BF16;
    int64_t lda = 0;
    const void* b = nullptr;
    DType b_type = DType::BF16;
    int64_t ldb = 0;
    void* c = nullptr;                      // output (D = C)
    DType c_type = DType::BF16;
    int64_t ldc = 0;
    float alpha = 1.0f, beta = 0.0f;        // beta = 1 accumulates into C
    const void* bias = nullptr;             // per-row of C (column-major m), i.e. per output feature
    DType bias_type = DType::BF16;
    // FP8 only: device pointers to fp32 scale factors (each 16-byte aligned: cuBLASLt 13 insists)
    const float* a_scale = nullptr;
    const float* b_scale = nullptr;
    // FP8 only: cuBLASLt's fast accumulation (no periodic promotion of the tensor-core partial sums
    // to full fp32: faster, less accurate). Off by default.
    bool fp8_fast_accum = false;
    // 0: every pointer is 256-byte aligned (cuBLASLt's default assumption, which the model's own
    // buffers meet). Otherwise the bytes the pointers are known to be aligned to (a power of two; a
    // view into a slice of a fused matrix, e.g. the LoRA adapters' part of q|k|v): the heuristic is
    // then asked only for algorithms that accept that alignment.
    int min_alignment = 0;
};

// What autotuning found (GemmRunner with autotune on): shapes decided, and for those the summed time of
// one call (the best of its timed calls) with cuBLASLt's first heuristic choice and with the one kept.
struct GemmTuningStats {
    int shapes_tuned = 0;
    int shapes_from_cache = 0;   // decided earlier in this process (another GemmRunner, same device)
    int shapes_exploring = 0;    // still trying candidates
    int64_t calls_timed = 0;     // real calls made with a candidate under trial
    double heuristic_ms = 0.0;   // with the heuristic's first algorithm
    double chosen_ms = 0.0;      // with the algorithm kept
};

class GemmRunner {
public:
    // autotune: each shape's first calls try up to kAutotuneCandidates of cuBLASLt's heuristic
    // candidates in turn, timed in place (cuda/gemm_autotune.h), and the fastest is kept. Every call is
    // a real product (only the algorithm differs). Choices are shared by every GemmRunner of the
    // process on the same device, so models compared within one process end up with the same
    // algorithms; separate runs may choose differently and then differ in the last bits. Off: the
    // heuristic's first choice, deterministic.
    static constexpr int kAutotuneCandidates = 16;
    static constexpr int kAutotuneSamples = 2;  // timed calls per candidate, after one not counted
    explicit GemmRunner(std::size_t workspace_bytes = 64ull << 20, bool autotune = false);
    ~GemmRunner();
    GemmRunner(const GemmRunner&) = delete;
    GemmRunner& operator=(const GemmRunner&) = delete;

    void run(const GemmOp& op, cudaStream_t stream);

    // ---- row-major helpers (see the table above) ----
    void linear_forward(void* y, DType y_type, const void* x, const void* w, DType in_type, const void* bias,
                        int64_t n_tokens, int64_t in_features, int64_t out_features, cudaStream_t stream,
                        float beta = 0.0f);
    void linear_backward_input(void* dx, DType dx_type, const void* dy, const void* w, DType in_type,
                               int64_t n_tokens, int64_t in_features, int64_t out_features, cudaStream_t stream,
                               float beta = 0.0f);
    // dW is accumulated (beta = 1) unless `accumulate` is false; dW may be fp32 with bf16 inputs.
    void linear_backward_weight(void* dw, DType dw_type, const void* dy, const void* x, DType in_type,
                                int64_t n_tokens, int64_t in_features, int64_t out_features, bool accumulate,
                                cudaStream_t stream);

    // ---- FP8 row-major helpers (see the FP8 table above) ----
    // Operands are fp8 bytes (x_type etc. E4M3 or E5M2), each with its device inv-scale pointer.
    // y_type / dx_type: BF16 or F32; bias: bf16 [out] or null. beta = 1 accumulates into y / dx.
    void linear_forward_fp8(void* y, DType y_type, const void* xq, DType x_type, const float* x_inv_scale,
                            const void* wq, DType w_type, const float* w_inv_scale, const void* bias,
                            int64_t n_tokens, int64_t in_features, int64_t out_features, cudaStream_t stream,
                            float beta = 0.0f, bool fast_accum = false);
    // wTq: the weight quantised transposed, [in, out] (quantize_fp8_transpose of W[out, in]).
    void linear_backward_input_fp8(void* dx, DType dx_type, const void* dyq, DType dy_type, const float* dy_inv_scale,
                                   const void* wTq, DType w_type, const float* w_inv_scale, int64_t n_tokens,
                                   int64_t in_features, int64_t out_features, cudaStream_t stream, float beta = 0.0f,
                                   bool fast_accum = false);
    // dyTq: [out, N] and xTq: [in, N] (both quantised transposed). dW is [out, in], F32 (or BF16);
    // accumulated (beta = 1) unless `accumulate` is false.
    void linear_backward_weight_fp8(void* dw, DType dw_type, const void* dyTq, DType dy_type,
                                    const float* dy_inv_scale, const void* xTq, DType x_type,
                                    const float* x_inv_scale, int64_t n_tokens, int64_t in_features,
                                    int64_t out_features, bool accumulate, cudaStream_t stream,
                                    bool fast_accum = false);

    std::size_t cached_shapes() const;
    GemmTuningStats tuning_stats() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace qtrain
