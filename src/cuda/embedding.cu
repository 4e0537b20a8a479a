// Embedding lookup and its gradient. The backward must be deterministic, so instead of atomics
// (the usual scatter-add) the host groups positions by token once per micro-batch — it has the
// tokens anyway — and one block per distinct token sums its rows in position order. The gradient
// table may be pinned host memory (untied models with --offload-gradients): only the rows of the
// micro-batch's tokens cross PCIe, instead of a [vocab, hidden] fp32 table held on the device.
#include <algorithm>
#include <type_traits>

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

// G: the gradient table's element type. float: added in fp32 (device memory, or pinned host memory
// read and written over PCIe). __nv_bfloat16: pinned host memory, the fp32 sum rounded back to bf16
// stochastically (--param-grad-dtype=bf16), with the bits accumulate_bf16 would use for that element.
template <class T, class G>
__global__ void embedding_backward_kernel(G* dtable, const T* dout, const int32_t* unique_tokens,
                                          const int32_t* offsets, const int32_t* positions,
                                          const int32_t* num_unique, int C, uint64_t index_base, uint32_t seed) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int n_u = *num_unique;
    for (int u = blockIdx.y; u < n_u; u += gridDim.y) {  // one block row per token: no two blocks share a row
        float acc = 0.0f;
        for (int p = offsets[u]; p < offsets[u + 1]; ++p)
            acc += to_float(dout[static_cast<int64_t>(positions[p]) * C + c]);
        const int64_t i = static_cast<int64_t>(unique_tokens[u]) * C + c;
        if constexpr (std::is_same_v<G, float>) {
            dtable[i] += acc;
        } else {
            const float x = __bfloat162float(dtable[i]) + acc;
            const uint64_t e = index_base + static_cast<uint64_t>(i);
            dtable[i] = bf16_stochastic(x, grad_rounding_bits(e & ~uint64_t{3}, static_cast<int>(e & 3), seed, x));
        }
    }
}

void embedding_forward(DType act, void* out, const int32_t* tokens, const void* table, int N, int C, cudaStream_t s) {
    if (N == 0) return;
    QTRAIN_DISPATCH_ACT(act, T, embedding_forward_kernel<T><<<N, 256, 0, s>>>(static_cast<T*>(out), tokens,
                                                                               static_cast<const T*>(table), C));
    CUDA_CHECK(cudaGetLastError());
}

void embedding_backward(void* dtable, DType table_type, DType act, const void* dout, const int32_t* unique_tokens,
                        const int32_t* offsets, const int32_t* positions, const int32_t* num_unique, int max_unique,
                        int C, cudaStream_t s, uint64_t index_base, uint32_t seed) {
    QT_CHECK(table_type == DType::F32 || table_type == DType::BF16,
             "embedding_backward: the gradient table must be fp32 or bf16");
    if (max_unique == 0) return;
    dim3 grid(ceil_div(C, 128), std::min(max_unique, 65535));
    QTRAIN_DISPATCH_ACT(act, T, {
        if (table_type == DType::F32)
            embedding_backward_kernel<T, float><<<grid, 128, 0, s>>>(static_cast<float*>(dtable), static_cast<const T*>(dout),
                                                                     unique_tokens, offsets, positions, num_unique, C,
                                                                     index_base, seed);
        else
            embedding_backward_kernel<T, __nv_bfloat16><<<grid, 128, 0, s>>>(
                static_cast<__nv_bfloat16*>(dtable), static_cast<const T*>(dout), unique_tokens, offsets, positions,
                num_unique, C, index_base, seed);
    });
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
