// Residual add fused with RMSNorm (one pass over the residual stream instead of two), and its
// backward. Forward: one block per row; the row is read once into registers-by-way-of-L1 (read
// twice from global, the second read hits cache). The stored residual is rounded to the
// activation type first, and the norm is computed from that rounded value, so the backward (which
// reads the stored residual) differentiates exactly the function the forward computed.
// Backward: the input gradient needs a per-row reduction (one block per row); the weight gradient
// is a deterministic column sum of dy * x * rstd (column_sums.cuh).
#include "cuda/check.h"
#include "cuda/column_sums.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"

namespace qtrain::cuda {

namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void residual_rmsnorm_forward_kernel(T* res_out, T* norm_out, float* rstd_out, const T* res_in,
                                                const T* delta, const T* weight, int C, float eps) {
    __shared__ float red[32];
    const int64_t row = static_cast<int64_t>(blockIdx.x) * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float x = to_float(res_in[row + c]);
        if (delta) {
            const T stored = from_float<T>(x + to_float(delta[row + c]));
            res_out[row + c] = stored;
            x = to_float(stored);
        }
        ss += x * x;
    }
    ss = block_sum(ss, red);
    const float rstd = rsqrtf(ss / static_cast<float>(C) + eps);
    if (threadIdx.x == 0) rstd_out[blockIdx.x] = rstd;
    const T* src = delta ? res_out : res_in;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        norm_out[row + c] = from_float<T>(to_float(weight[c]) * (to_float(src[row + c]) * rstd));
}

// dx = rstd * (w*dy) - rstd^3 / C * x * sum(w*dy*x); accumulated into dres.
template <class T>
__global__ void rmsnorm_backward_input_kernel(T* dres, const T* dnorm, const T* inp, const T* weight,
                                              const float* rstd, int C) {
    __shared__ float red[32];
    const int64_t row = static_cast<int64_t>(blockIdx.x) * C;
    const float r = rstd[blockIdx.x];
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dot += to_float(weight[c]) * to_float(dnorm[row + c]) * to_float(inp[row + c]);
    dot = block_sum(dot, red);
    const float k = r * r * r * dot / static_cast<float>(C);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float dx = r * to_float(weight[c]) * to_float(dnorm[row + c]) - k * to_float(inp[row + c]);
        dres[row + c] = from_float<T>(to_float(dres[row + c]) + dx);
    }
}

}  // namespace

void residual_rmsnorm_forward(DType act, void* res_out, void* norm_out, float* rstd, const void* res_in,
                              const void* delta, const void* weight, int N, int C, float eps, cudaStream_t s) {
    if (N == 0) return;
    QTRAIN_DISPATCH_ACT(act, T,
                        residual_rmsnorm_forward_kernel<T><<<N, kThreads, 0, s>>>(
                            static_cast<T*>(res_out), static_cast<T*>(norm_out), rstd, static_cast<const T*>(res_in),
                            static_cast<const T*>(delta), static_cast<const T*>(weight), C, eps));
    CUDA_CHECK(cudaGetLastError());
}

std::size_t rmsnorm_backward_scratch_floats(int N, int C) {
    return static_cast<std::size_t>(column_sum_blocks(N)) * C;
}

void rmsnorm_backward(DType act, void* dres, float* dweight, float* scratch, const void* dnorm, const void* inp,
                      const void* weight, const float* rstd, int N, int C, cudaStream_t s) {
    if (N == 0) return;
    QTRAIN_DISPATCH_ACT(act, T, {
        rmsnorm_backward_input_kernel<T><<<N, kThreads, 0, s>>>(static_cast<T*>(dres), static_cast<const T*>(dnorm),
                                                                static_cast<const T*>(inp), static_cast<const T*>(weight),
                                                                rstd, C);
        column_sums<T>(dweight, scratch, static_cast<const T*>(dnorm), static_cast<const T*>(inp), rstd, N, C, s);
    });
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
