// LoRA dropout on the adapters' input (issue 33): the mask of core/lora_dropout.h, computed per
// element from its index, so the forward, the recompute and the backward draw the same one and the
// CPU reference model drops the same elements.
#include <algorithm>

#include "core/lora_dropout.h"
#include "cuda/check.h"
#include "cuda/dispatch.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"

namespace qtrain::cuda {

namespace {

template <class T>
__global__ void lora_dropout_forward_kernel(T* out, const T* x, int64_t n, uint64_t seed, const uint64_t* pass,
                                            uint64_t slot, float p, float keep) {
    const uint64_t stream = lora_dropout_stream(seed, *pass, slot);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        out[i] = from_float<T>(to_float(x[i]) * lora_dropout_scale(stream, static_cast<uint64_t>(i), p, keep));
}

template <class T>
__global__ void lora_dropout_backward_kernel(T* dx, const T* g, int64_t n, uint64_t seed, const uint64_t* pass,
                                             uint64_t slot, float p, float keep) {
    const uint64_t stream = lora_dropout_stream(seed, *pass, slot);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        dx[i] = from_float<T>(to_float(dx[i]) +
                              lora_dropout_scale(stream, static_cast<uint64_t>(i), p, keep) * to_float(g[i]));
}

__global__ void lora_count_pass_kernel(uint64_t* pass, uint64_t step) { *pass += step; }

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 65535)); }

}  // namespace

void lora_dropout_forward(DType act, void* out, const void* x, int64_t n, uint64_t seed, const uint64_t* pass,
                          uint64_t slot, float p, cudaStream_t s) {
    if (n == 0) return;
    const float keep = 1.0f / (1.0f - p);  // as the CPU model computes it
    QTRAIN_DISPATCH_ACT(act, T, lora_dropout_forward_kernel<T><<<grid_for(n), 256, 0, s>>>(
                                    static_cast<T*>(out), static_cast<const T*>(x), n, seed, pass, slot, p, keep));
    CUDA_CHECK(cudaGetLastError());
}

void lora_dropout_backward_add(DType act, void* dx, const void* g, int64_t n, uint64_t seed, const uint64_t* pass,
                               uint64_t slot, float p, cudaStream_t s) {
    if (n == 0) return;
    const float keep = 1.0f / (1.0f - p);
    QTRAIN_DISPATCH_ACT(act, T, lora_dropout_backward_kernel<T><<<grid_for(n), 256, 0, s>>>(
                                    static_cast<T*>(dx), static_cast<const T*>(g), n, seed, pass, slot, p, keep));
    CUDA_CHECK(cudaGetLastError());
}

void lora_count_pass(uint64_t* pass, uint64_t step, cudaStream_t s) {
    lora_count_pass_kernel<<<1, 1, 0, s>>>(pass, step);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
