// SwiGLU on the fused gate|up projection output: one elementwise pass each way (the fused GEMM
// writes [gate | up] per token, so no split copies exist).
#include "cuda/check.h"
#include "cuda/dispatch.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"

namespace qtrain::cuda {

namespace {

template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* gate_up, int I, int64_t total) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int64_t n = idx / I;
    const int i = static_cast<int>(idx % I);
    const float g = to_float(gate_up[n * 2 * I + i]);
    const float u = to_float(gate_up[n * 2 * I + I + i]);
    out[idx] = from_float<T>(g / (1.0f + expf(-g)) * u);
}

template <class T>
__global__ void swiglu_backward_kernel(T* dgate_up, const T* dout, const T* gate_up, int I, int64_t total) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int64_t n = idx / I;
    const int i = static_cast<int>(idx % I);
    const float g = to_float(gate_up[n * 2 * I + i]);
    const float u = to_float(gate_up[n * 2 * I + I + i]);
    const float d = to_float(dout[idx]);
    const float sig = 1.0f / (1.0f + expf(-g));
    const float silu = g * sig;
    dgate_up[n * 2 * I + i] = from_float<T>(d * u * sig * (1.0f + g * (1.0f - sig)));
    dgate_up[n * 2 * I + I + i] = from_float<T>(d * silu);
}

}  // namespace

void swiglu_forward(DType act, void* out, const void* gate_up, int N, int I, cudaStream_t s) {
    const int64_t total = static_cast<int64_t>(N) * I;
    if (total == 0) return;
    QTRAIN_DISPATCH_ACT(act, T, swiglu_forward_kernel<T><<<ceil_div(total, 256), 256, 0, s>>>(
                                    static_cast<T*>(out), static_cast<const T*>(gate_up), I, total));
    CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(DType act, void* dgate_up, const void* dout, const void* gate_up, int N, int I, cudaStream_t s) {
    const int64_t total = static_cast<int64_t>(N) * I;
    if (total == 0) return;
    QTRAIN_DISPATCH_ACT(act, T, swiglu_backward_kernel<T><<<ceil_div(total, 256), 256, 0, s>>>(
                                    static_cast<T*>(dgate_up), static_cast<const T*>(dout),
                                    static_cast<const T*>(gate_up), I, total));
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
