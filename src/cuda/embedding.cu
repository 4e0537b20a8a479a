// Embedding lookup and its gradient. The backward must be deterministic, so instead of atomics
// (the usual scatter-add) the host groups positions by token once per micro-batch — it has the
// tokens anyway — and one block per distinct token sums its rows in position order.
#include <algorithm>

#include "cuda/check.h"
#include "cuda/dispatch.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"

namespace qtrain::cuda {

template <class T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* table, int C) {
    const int n = blockIdx.x;
    const T* src = table + static_cast<int64_t>(tokens[n]) * C;
    T* dst = out + static_cast<int64_t>(n) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

template <class T>
__global__ void embedding_backward_kernel(float* dtable, const T* dout, const int32_t* unique_tokens,
                                          const int32_t* offsets, const int32_t* positions,
                                          const int32_t* num_unique, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int n_u = *num_unique;
    for (int u = blockIdx.y; u < n_u; u += gridDim.y) {  // one block row per token: no two blocks share a row
        float acc = 0.0f;
        for (int p = offsets[u]; p < offsets[u + 1]; ++p)
            acc += to_float(dout[static_cast<int64_t>(positions[p]) * C + c]);
        dtable[static_cast<int64_t>(unique_tokens[u]) * C + c] += acc;
    }
}

void embedding_forward(DType act, void* out, const int32_t* tokens, const void* table, int N, int C, cudaStream_t s) {
    if (N == 0) return;
    QTRAIN_DISPATCH_ACT(act, T, embedding_forward_kernel<T><<<N, 256, 0, s>>>(static_cast<T*>(out), tokens,
                                                                               static_cast<const T*>(table), C));
    CUDA_CHECK(cudaGetLastError());
}

void embedding_backward(float* dtable, DType act, const void* dout, const int32_t* unique_tokens,
                        const int32_t* offsets, const int32_t* positions, const int32_t* num_unique, int max_unique,
                        int C, cudaStream_t s) {
    if (max_unique == 0) return;
    dim3 grid(ceil_div(C, 128), std::min(max_unique, 65535));
    QTRAIN_DISPATCH_ACT(act, T, embedding_backward_kernel<T><<<grid, 128, 0, s>>>(
                                    dtable, static_cast<const T*>(dout), unique_tokens, offsets, positions,
                                    num_unique, C));
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
