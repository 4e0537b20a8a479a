// Softmax cross-entropy over a chunk of LM-head logits, with the logit gradient written in place
// (the chunk's logits are dead after this, so their buffer becomes dlogits for the two backward
// GEMMs). One block per row: the vocab (~152k) is wide enough to keep 1024 threads busy.
// Max and sum use an online rescaling so the row is read twice in total (stats, then gradient),
// with 16-byte vector accesses when the row allows.
#include "cuda/check.h"
#include "cuda/dispatch.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"

namespace qtrain::cuda {

namespace {

constexpr int kThreads = 1024;

// Online (max, sum) update for one value.
__device__ __forceinline__ void online_add(float& m, float& s, float v) {
    if (v > m) {
        s = s * __expf(m - v) + 1.0f;
        m = v;
    } else {
        s += __expf(v - m);
    }
}

// kVec: rows are 16-byte aligned and V is a multiple of the pack size, so the row is read with
// vector loads (8 bf16 at a time); otherwise element by element.
template <class T, bool kVec>
__global__ void softmax_cross_entropy_kernel(T* logits, float* losses, const int32_t* targets, int V,
                                             const float* dscale_ptr, bool write_grad) {
    const float dscale = *dscale_ptr;
    constexpr int P = Pack<T>::N;
    __shared__ float red[32];
    const int64_t row = static_cast<int64_t>(blockIdx.x) * V;
    const int target = targets[blockIdx.x];
    T* x = logits + row;
    if (target < 0) {
        if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
        if (write_grad)
            for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] = from_float<T>(0.0f);
        return;
    }
    // per-thread online max/sum
    float m = -INFINITY, s = 0.0f;
    if constexpr (kVec) {
        for (int j = threadIdx.x * P; j < V; j += blockDim.x * P) {
            Pack<T> p;
            p.load(x + j);
#pragma unroll
            for (int k = 0; k < P; ++k) online_add(m, s, p.v[k]);
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) online_add(m, s, to_float(x[j]));
    }
    const float gm = block_max(m, red);
    s = (m == -INFINITY) ? 0.0f : s * __expf(m - gm);
    const float gs = block_sum(s, red);
    const float lse = gm + __logf(gs);
    const float target_logit = to_float(x[target]);
    __syncthreads();  // every thread has read x[target] before anyone overwrites it
    if (threadIdx.x == 0) losses[blockIdx.x] = lse - target_logit;
    if (!write_grad) return;
    if constexpr (kVec) {
        for (int j = threadIdx.x * P; j < V; j += blockDim.x * P) {
            Pack<T> p;
            p.load(x + j);
#pragma unroll
            for (int k = 0; k < P; ++k) p.v[k] = (__expf(p.v[k] - lse) - (j + k == target ? 1.0f : 0.0f)) * dscale;
            p.store(x + j);
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            const float p = __expf(to_float(x[j]) - lse);
            x[j] = from_float<T>((p - (j == target ? 1.0f : 0.0f)) * dscale);
        }
    }
}

__global__ void accumulate_loss_kernel(float* acc, const float* losses, int n, const float* scale) {
    __shared__ float red[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += losses[i];
    s = block_sum(s, red);
    if (threadIdx.x == 0) *acc += *scale * s;
}

}  // namespace

void softmax_cross_entropy(DType act, void* logits, float* losses, const int32_t* targets, int n, int V,
                           const float* dscale, bool write_grad, cudaStream_t s) {
    if (n == 0) return;
    QTRAIN_DISPATCH_ACT(act, T, {
        if (rows_vectorizable<T>(logits, V))
            softmax_cross_entropy_kernel<T, true><<<n, kThreads, 0, s>>>(static_cast<T*>(logits), losses, targets, V,
                                                                         dscale, write_grad);
        else
            softmax_cross_entropy_kernel<T, false><<<n, kThreads, 0, s>>>(static_cast<T*>(logits), losses, targets, V,
                                                                          dscale, write_grad);
    });
    CUDA_CHECK(cudaGetLastError());
}

void accumulate_loss(float* acc, const float* losses, int n, const float* scale, cudaStream_t s) {
    accumulate_loss_kernel<<<1, 1024, 0, s>>>(acc, losses, n, scale);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
