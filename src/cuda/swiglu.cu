// SwiGLU on the fused gate|up projection output: one elementwise pass each way (the fused GEMM
// writes [gate | up] per token, so no split copies exist). Memory-bound: 16-byte vector loads and
// stores (8 bf16 per access) and a 2-D grid (rows x column packs) so no thread does 64-bit
// division; a scalar fallback covers widths that are not a multiple of the vector size.
// With FP8 the output feeds a quantised GEMM, whose scale needs the output's abs-max: the kernels
// fold it in (of the stored, rounded values) so no separate pass re-reads the tensor.
#include "cuda/check.h"
#include "cuda/fp8_common.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"
#include "cuda/swiglu_math.cuh"

namespace qtrain::cuda {

namespace {

__device__ __forceinline__ float sigmoid(float g) { return swiglu_sigmoid(g); }

template <class T>
__device__ __forceinline__ unsigned stored_abs_bits(unsigned m, float x) {
    return abs_max_bits(m, to_float(from_float<T>(x)));
}

template <class T>
__global__ void swiglu_forward_vec(T* out, const T* gate_up, int I, float* amax) {
    constexpr int V = Pack<T>::N;
    const int64_t n = blockIdx.y;
    const int i = (blockIdx.x * blockDim.x + threadIdx.x) * V;
    unsigned m = 0;
    if (i < I) {
        Pack<T> g, u, o;
        g.load(gate_up + n * 2 * I + i);
        u.load(gate_up + n * 2 * I + I + i);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            o.v[k] = g.v[k] * sigmoid(g.v[k]) * u.v[k];
            m = stored_abs_bits<T>(m, o.v[k]);
        }
        o.store(out + n * I + i);
    }
    if (amax) reduce_abs_max(amax, m);  // uniform branch: every thread of the block takes it
}

template <class T>
__global__ void swiglu_backward_vec(T* dgate_up, const T* dout, const T* gate_up, int I, float* amax) {
    constexpr int V = Pack<T>::N;
    const int64_t n = blockIdx.y;
    const int i = (blockIdx.x * blockDim.x + threadIdx.x) * V;
    unsigned m = 0;
    if (i < I) {
        Pack<T> g, u, d, dg, du;
        g.load(gate_up + n * 2 * I + i);
        u.load(gate_up + n * 2 * I + I + i);
        d.load(dout + n * I + i);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            swiglu_grads(d.v[k], g.v[k], u.v[k], dg.v[k], du.v[k]);
            m = stored_abs_bits<T>(stored_abs_bits<T>(m, dg.v[k]), du.v[k]);
        }
        if (dgate_up) {  // null: the abs-max only (the FP8 path quantises the gradients as it recomputes them)
            dg.store(dgate_up + n * 2 * I + i);
            du.store(dgate_up + n * 2 * I + I + i);
        }
    }
    if (amax) reduce_abs_max(amax, m);
}

template <class T>
__global__ void swiglu_forward_scalar(T* out, const T* gate_up, int I, int64_t total, float* amax) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    unsigned m = 0;
    if (idx < total) {
        const int64_t n = idx / I;
        const int i = static_cast<int>(idx % I);
        const float g = to_float(gate_up[n * 2 * I + i]);
        const float u = to_float(gate_up[n * 2 * I + I + i]);
        const float o = g * sigmoid(g) * u;
        out[idx] = from_float<T>(o);
        m = stored_abs_bits<T>(m, o);
    }
    if (amax) reduce_abs_max(amax, m);
}

template <class T>
__global__ void swiglu_backward_scalar(T* dgate_up, const T* dout, const T* gate_up, int I, int64_t total,
                                       float* amax) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    unsigned m = 0;
    if (idx < total) {
        const int64_t n = idx / I;
        const int i = static_cast<int>(idx % I);
        const float g = to_float(gate_up[n * 2 * I + i]);
        const float u = to_float(gate_up[n * 2 * I + I + i]);
        const float d = to_float(dout[idx]);
        float dg, du;
        swiglu_grads(d, g, u, dg, du);
        if (dgate_up) {
            dgate_up[n * 2 * I + i] = from_float<T>(dg);
            dgate_up[n * 2 * I + I + i] = from_float<T>(du);
        }
        m = stored_abs_bits<T>(stored_abs_bits<T>(m, dg), du);
    }
    if (amax) reduce_abs_max(amax, m);
}

template <class T>
bool use_vector_path(const void* a, const void* b, const void* c, int N, int I) {
    return rows_vectorizable<T>(a, I) && rows_vectorizable<T>(b, I) && (c == nullptr || rows_vectorizable<T>(c, I)) &&
           N <= 65535;
}

}  // namespace

void swiglu_forward(DType act, void* out, const void* gate_up, int N, int I, cudaStream_t s, float* amax) {
    const int64_t total = static_cast<int64_t>(N) * I;
    if (amax) CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
    if (total == 0) return;
    QTRAIN_DISPATCH_ACT(act, T, {
        if (use_vector_path<T>(out, gate_up, nullptr, N, I)) {
            dim3 grid(ceil_div(I / Pack<T>::N, 128), N);
            swiglu_forward_vec<T><<<grid, 128, 0, s>>>(static_cast<T*>(out), static_cast<const T*>(gate_up), I, amax);
        } else {
            swiglu_forward_scalar<T><<<ceil_div(total, 256), 256, 0, s>>>(static_cast<T*>(out),
                                                                         static_cast<const T*>(gate_up), I, total, amax);
        }
    });
    CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(DType act, void* dgate_up, const void* dout, const void* gate_up, int N, int I, cudaStream_t s,
                     float* amax) {
    const int64_t total = static_cast<int64_t>(N) * I;
    if (amax) CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
    if (total == 0) return;
    QTRAIN_DISPATCH_ACT(act, T, {
        if (use_vector_path<T>(dgate_up, gate_up, dout, N, I)) {
            dim3 grid(ceil_div(I / Pack<T>::N, 128), N);
            swiglu_backward_vec<T><<<grid, 128, 0, s>>>(static_cast<T*>(dgate_up), static_cast<const T*>(dout),
                                                        static_cast<const T*>(gate_up), I, amax);
        } else {
            swiglu_backward_scalar<T><<<ceil_div(total, 256), 256, 0, s>>>(
                static_cast<T*>(dgate_up), static_cast<const T*>(dout), static_cast<const T*>(gate_up), I, total, amax);
        }
    });
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
