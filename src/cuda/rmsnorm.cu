// Residual add fused with RMSNorm (one pass over the residual stream instead of two), and its
// backward fused with the weight gradient. The stored residual is rounded to the activation type
// first and the norm is computed from that rounded value, so the backward (which reads the stored
// residual) differentiates exactly the function the forward computed.
// Fast path (C a multiple of the 16-byte pack, as every Qwen hidden size is): one block per row in
// the forward, each thread holding one pack of the row in registers, so the row is read once.
// The backward runs a fixed number of blocks (column_sums.cuh's G), each walking a strided set of
// rows: per row a block reduction gives the input gradient, and each thread keeps running weight-
// gradient sums for its columns in registers; the G partial rows are then reduced in a fixed order.
// A scalar path covers other widths.
// With FP8 the norm output (forward) and the residual gradient (backward) feed quantised GEMMs: an
// optional amax pointer folds their abs-max (of the stored values) into these kernels.
#include "cuda/check.h"
#include "cuda/fp8_common.cuh"
#include "cuda/column_sums.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"

namespace qtrain::cuda {

namespace {

constexpr int kThreads = 256;

// ---- vector path ----

template <class T>
__global__ void residual_rmsnorm_forward_vec(T* res_out, T* norm_out, float* rstd_out, const T* res_in,
                                             const T* delta, const T* weight, int C, float eps, float* amax) {
    constexpr int P = Pack<T>::N;
    __shared__ float red[32];
    const int64_t row = static_cast<int64_t>(blockIdx.x) * C;
    const int c = threadIdx.x * P;
    const bool active = c < C;
    Pack<T> x;
    float ss = 0.0f;
    if (active) {
        x.load(res_in + row + c);
        if (delta) {
            Pack<T> d;
            d.load(delta + row + c);
            for (int k = 0; k < P; ++k) x.v[k] += d.v[k];
            x.store(res_out + row + c);
            for (int k = 0; k < P; ++k) x.v[k] = to_float(from_float<T>(x.v[k]));  // the stored value
        }
        for (int k = 0; k < P; ++k) ss += x.v[k] * x.v[k];
    }
    ss = block_sum(ss, red);
    const float rstd = rsqrtf(ss / static_cast<float>(C) + eps);
    if (threadIdx.x == 0) rstd_out[blockIdx.x] = rstd;
    unsigned m = 0;
    if (active) {
        Pack<T> w;
        w.load(weight + c);
        for (int k = 0; k < P; ++k) {
            x.v[k] = w.v[k] * (x.v[k] * rstd);
            m = abs_max_bits(m, to_float(from_float<T>(x.v[k])));
        }
        x.store(norm_out + row + c);
    }
    if (amax) reduce_abs_max(amax, m);  // uniform branch: every thread takes it
}

// dx = rstd * (w*dy) - rstd^3 / C * x * sum(w*dy*x), added into dres; dweight partials per block.
template <class T>
__global__ void rmsnorm_backward_vec(T* dres, float* partial, const T* dnorm, const T* inp, const T* weight,
                                     const float* rstd, int N, int C, float* amax) {
    constexpr int P = Pack<T>::N;
    __shared__ float red[32];
    const int c = threadIdx.x * P;
    const bool active = c < C;
    Pack<T> w;
    float dw[P];
    for (int k = 0; k < P; ++k) dw[k] = 0.0f;
    if (active) w.load(weight + c);
    unsigned m = 0;  // abs-max bits of the dres values this thread stored
    for (int r = blockIdx.x; r < N; r += gridDim.x) {
        const int64_t row = static_cast<int64_t>(r) * C;
        const float rs = rstd[r];
        Pack<T> dy, x;
        float dot = 0.0f;
        if (active) {
            dy.load(dnorm + row + c);
            x.load(inp + row + c);
            for (int k = 0; k < P; ++k) dot += w.v[k] * dy.v[k] * x.v[k];
        }
        dot = block_sum(dot, red);
        if (active) {
            const float kk = rs * rs * rs * dot / static_cast<float>(C);
            Pack<T> d;
            d.load(dres + row + c);
            for (int k = 0; k < P; ++k) {
                d.v[k] += rs * w.v[k] * dy.v[k] - kk * x.v[k];
                dw[k] += dy.v[k] * x.v[k] * rs;
            }
            d.store(dres + row + c);
            for (int k = 0; k < P; ++k) m = abs_max_bits(m, to_float(from_float<T>(d.v[k])));
        }
    }
    if (active)
        for (int k = 0; k < P; ++k) partial[static_cast<int64_t>(blockIdx.x) * C + c + k] = dw[k];
    if (amax) reduce_abs_max(amax, m);
}

// ---- scalar path ----

template <class T>
__global__ void residual_rmsnorm_forward_scalar(T* res_out, T* norm_out, float* rstd_out, const T* res_in,
                                                const T* delta, const T* weight, int C, float eps, float* amax) {
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
    unsigned m = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const T y = from_float<T>(to_float(weight[c]) * (to_float(src[row + c]) * rstd));
        norm_out[row + c] = y;
        m = abs_max_bits(m, to_float(y));
    }
    if (amax) reduce_abs_max(amax, m);
}

template <class T>
__global__ void rmsnorm_backward_input_scalar(T* dres, const T* dnorm, const T* inp, const T* weight,
                                              const float* rstd, int C, float* amax) {
    __shared__ float red[32];
    const int64_t row = static_cast<int64_t>(blockIdx.x) * C;
    const float r = rstd[blockIdx.x];
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dot += to_float(weight[c]) * to_float(dnorm[row + c]) * to_float(inp[row + c]);
    dot = block_sum(dot, red);
    const float k = r * r * r * dot / static_cast<float>(C);
    unsigned m = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float dx = r * to_float(weight[c]) * to_float(dnorm[row + c]) - k * to_float(inp[row + c]);
        const T stored = from_float<T>(to_float(dres[row + c]) + dx);
        dres[row + c] = stored;
        m = abs_max_bits(m, to_float(stored));
    }
    if (amax) reduce_abs_max(amax, m);
}

template <class T>
bool vec_ok(int C, std::initializer_list<const void*> ptrs) {
    if (C % Pack<T>::N != 0 || C / Pack<T>::N > 1024) return false;
    for (const void* p : ptrs)
        if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
    return true;
}

int threads_for(int packs) { return std::max(32, (packs + 31) / 32 * 32); }

}  // namespace

void residual_rmsnorm_forward(DType act, void* res_out, void* norm_out, float* rstd, const void* res_in,
                              const void* delta, const void* weight, int N, int C, float eps, cudaStream_t s,
                              float* amax) {
    if (amax) CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
    if (N == 0) return;
    QTRAIN_DISPATCH_ACT(act, T, {
        auto args = [&](auto kernel, int threads) {
            kernel<<<N, threads, 0, s>>>(static_cast<T*>(res_out), static_cast<T*>(norm_out), rstd,
                                         static_cast<const T*>(res_in), static_cast<const T*>(delta),
                                         static_cast<const T*>(weight), C, eps, amax);
        };
        if (vec_ok<T>(C, {res_out, norm_out, res_in, delta, weight}))
            args(residual_rmsnorm_forward_vec<T>, threads_for(C / Pack<T>::N));
        else
            args(residual_rmsnorm_forward_scalar<T>, kThreads);
    });
    CUDA_CHECK(cudaGetLastError());
}

std::size_t rmsnorm_backward_scratch_floats(int N, int C) {
    return static_cast<std::size_t>(column_sum_blocks(N)) * C;
}

void rmsnorm_backward(DType act, void* dres, float* dweight, float* scratch, const void* dnorm, const void* inp,
                      const void* weight, const float* rstd, int N, int C, cudaStream_t s, float* amax) {
    if (amax) CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
    if (N == 0) return;
    QTRAIN_DISPATCH_ACT(act, T, {
        if (vec_ok<T>(C, {dres, dnorm, inp, weight})) {
            const int G = column_sum_blocks(N);
            rmsnorm_backward_vec<T><<<G, threads_for(C / Pack<T>::N), 0, s>>>(
                static_cast<T*>(dres), scratch, static_cast<const T*>(dnorm), static_cast<const T*>(inp),
                static_cast<const T*>(weight), rstd, N, C, amax);
            if (dweight) column_reduce(dweight, scratch, G, C, s);  // (null: a frozen weight, LoRA)
        } else {
            rmsnorm_backward_input_scalar<T><<<N, kThreads, 0, s>>>(
                static_cast<T*>(dres), static_cast<const T*>(dnorm), static_cast<const T*>(inp),
                static_cast<const T*>(weight), rstd, C, amax);
            if (dweight)
                column_sums<T>(dweight, scratch, static_cast<const T*>(dnorm), static_cast<const T*>(inp), rstd, N, C, s);
        }
    });
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
