// Matrix products through cuBLASLt, with the matmul descriptor, layouts and the chosen algorithm
// cached per shape (a training step repeats the same few dozen shapes thousands of times).
//
// All tensors are row-major, as the model stores them; the row-major helpers below map each product
// to cuBLAS's column-major view (a row-major [r, c] matrix is a column-major [c, r] one):
//   forward       y[N,out]   = x[N,in] · W[out,in]^T (+ bias)   -> TN, m=out n=N k=in
//   input grad    dx[N,in]   = dy[N,out] · W[out,in]            -> NN, m=in  n=N k=out
//   weight grad   dW[out,in] (+)= dy[N,out]^T · x[N,in]         -> NT, m=in  n=out k=N
// TN is also the layout cuBLASLt's FP8 kernels require.
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
};

class GemmRunner {
public:
    explicit GemmRunner(std::size_t workspace_bytes = 64ull << 20);
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

    std::size_t cached_shapes() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace qtrain
