// Rotate-half RoPE applied in place to the q and k heads of the fused qkv buffer, so no separate
// q/k tensors exist. The cos/sin tables are computed on the host with the same float arithmetic as
// HF's Qwen2RotaryEmbedding, so GPU and CPU rotate by identical angles. Vector path: 8 pairs per thread.
#include "cuda/check.h"
#include "cuda/dispatch.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"

namespace qtrain::cuda {

namespace {

// One thread per (token, head among the Hq + Hkv rotated heads, pack of 8 pairs): 16-byte loads of
// x[i..i+8) and x[i+D/2..i+D/2+8) (D/2 is 32 or 64, so packs never straddle the halves).
template <class T, bool kBackward>
__global__ void rope_kernel_vec(T* qkv, const float* cos_sin, int T_len, int heads, int row_stride, int D,
                                int64_t total) {
    constexpr int P = Pack<T>::N;
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int half = D / 2, packs = half / P;
    const int i = static_cast<int>(idx % packs) * P;
    const int64_t rest = idx / packs;
    const int h = static_cast<int>(rest % heads);
    const int64_t n = rest / heads;
    const int t = static_cast<int>(n % T_len);
    const float* cs = cos_sin + static_cast<int64_t>(t) * half + i;
    const float* sn = cos_sin + static_cast<int64_t>(T_len) * half + static_cast<int64_t>(t) * half + i;
    T* x = qkv + n * row_stride + static_cast<int64_t>(h) * D;
    Pack<T> a, b, oa, ob;
    a.load(x + i);
    b.load(x + i + half);
#pragma unroll
    for (int k = 0; k < P; ++k) {
        const float c = cs[k], s = sn[k];
        if (!kBackward) {
            oa.v[k] = a.v[k] * c - b.v[k] * s;
            ob.v[k] = b.v[k] * c + a.v[k] * s;
        } else {
            oa.v[k] = a.v[k] * c + b.v[k] * s;
            ob.v[k] = b.v[k] * c - a.v[k] * s;
        }
    }
    oa.store(x + i);
    ob.store(x + i + half);
}

// One thread per (token, head among the Hq + Hkv rotated heads, pair index i < D/2).
template <class T, bool kBackward>
__global__ void rope_kernel(T* qkv, const float* cos_sin, int T_len, int heads, int row_stride, int D, int64_t total) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int half = D / 2;
    const int i = static_cast<int>(idx % half);
    const int64_t rest = idx / half;
    const int h = static_cast<int>(rest % heads);
    const int64_t n = rest / heads;
    const int t = static_cast<int>(n % T_len);
    const float c = cos_sin[static_cast<int64_t>(t) * half + i];
    const float sn = cos_sin[static_cast<int64_t>(T_len) * half + static_cast<int64_t>(t) * half + i];
    T* x = qkv + n * row_stride + static_cast<int64_t>(h) * D;  // q heads then k heads are contiguous
    const float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
    if (!kBackward) {
        x[i] = from_float<T>(x1 * c - x2 * sn);
        x[i + half] = from_float<T>(x2 * c + x1 * sn);
    } else {  // transpose of the rotation
        x[i] = from_float<T>(x1 * c + x2 * sn);
        x[i + half] = from_float<T>(x2 * c - x1 * sn);
    }
}

template <bool kBackward>
void launch(DType act, void* qkv, const float* cos_sin, int B, int T_len, int Hq, int Hkv, int D, cudaStream_t s) {
    const int heads = Hq + Hkv;
    const int row_stride = (Hq + 2 * Hkv) * D;
    const int64_t pairs = static_cast<int64_t>(B) * T_len * heads * (D / 2);
    if (pairs == 0) return;
    QTRAIN_DISPATCH_ACT(act, E, {
        constexpr int P = Pack<E>::N;
        if ((D / 2) % P == 0 && rows_vectorizable<E>(qkv, row_stride)) {
            const int64_t total = pairs / P;
            rope_kernel_vec<E, kBackward><<<ceil_div(total, 256), 256, 0, s>>>(static_cast<E*>(qkv), cos_sin, T_len,
                                                                              heads, row_stride, D, total);
        } else {
            rope_kernel<E, kBackward><<<ceil_div(pairs, 256), 256, 0, s>>>(static_cast<E*>(qkv), cos_sin, T_len,
                                                                          heads, row_stride, D, pairs);
        }
    });
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rope_forward(DType act, void* qkv, const float* cos_sin, int B, int T, int Hq, int Hkv, int D, cudaStream_t s) {
    launch<false>(act, qkv, cos_sin, B, T, Hq, Hkv, D, s);
}

void rope_backward(DType act, void* dqkv, const float* cos_sin, int B, int T, int Hq, int Hkv, int D, cudaStream_t s) {
    launch<true>(act, dqkv, cos_sin, B, T, Hq, Hkv, D, s);
}

}  // namespace qtrain::cuda
