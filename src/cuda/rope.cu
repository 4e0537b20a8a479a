// Rotate-half RoPE applied in place to the q and k heads of the fused qkv buffer, so no separate
// q/k tensors exist. The cos/sin tables are computed on the host with the same float arithmetic as
// HF's Qwen2RotaryEmbedding, so GPU and CPU rotate by identical angles. Vector path: 8 pairs per thread.
// Document masking: token n rotates by the angle of positions[n] (its place in its document, a row of
// the same table) instead of n % T.
#include "cuda/check.h"
#include "cuda/dispatch.cuh"
#include "cuda/fp8_common.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"

namespace qtrain::cuda {

namespace {

// One thread per (token, head among the Hq + Hkv rotated heads, pack of 8 pairs): 16-byte loads of
// x[i..i+8) and x[i+D/2..i+D/2+8) (D/2 is 32 or 64, so packs never straddle the halves).
// amax (backward, FP8 gradients; may be null): heads then counts the Hkv v heads too, which are only
// read — so *amax = max |dqkv| as stored over the whole tensor, the GEMM's quantisation input. No
// early return: every thread takes part in the block reduction.
template <class T, bool kBackward>
__global__ void rope_kernel_vec(T* qkv, const float* cos_sin, int T_len, int heads, int rotated, int row_stride, int D,
                                int64_t total, float* amax, const int32_t* positions) {
    constexpr int P = Pack<T>::N;
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    unsigned bits = 0;
    if (idx < total) {
        const int half = D / 2, packs = half / P;
        const int i = static_cast<int>(idx % packs) * P;
        const int64_t rest = idx / packs;
        const int h = static_cast<int>(rest % heads);
        const int64_t n = rest / heads;
        const int t = positions ? positions[n] : static_cast<int>(n % T_len);
        T* x = qkv + n * row_stride + static_cast<int64_t>(h) * D;
        Pack<T> a, b, oa, ob;
        a.load(x + i);
        b.load(x + i + half);
        if (h < rotated) {
            const float* cs = cos_sin + static_cast<int64_t>(t) * half + i;
            const float* sn = cos_sin + static_cast<int64_t>(T_len) * half + static_cast<int64_t>(t) * half + i;
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
        } else {  // a v head: unchanged, read for the amax only
            oa = a, ob = b;
        }
        if (amax) {
#pragma unroll
            for (int k = 0; k < P; ++k) {  // the values as stored (rounded to T)
                bits = abs_max_bits(bits, to_float(from_float<T>(oa.v[k])));
                bits = abs_max_bits(bits, to_float(from_float<T>(ob.v[k])));
            }
        }
    }
    if (amax) reduce_abs_max(amax, bits);  // uniform branch
}

// One thread per (token, head among the Hq + Hkv rotated heads (+ Hkv v heads with amax), pair index i < D/2).
template <class T, bool kBackward>
__global__ void rope_kernel(T* qkv, const float* cos_sin, int T_len, int heads, int rotated, int row_stride, int D,
                            int64_t total, float* amax, const int32_t* positions) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    unsigned bits = 0;
    if (idx < total) {
        const int half = D / 2;
        const int i = static_cast<int>(idx % half);
        const int64_t rest = idx / half;
        const int h = static_cast<int>(rest % heads);
        const int64_t n = rest / heads;
        const int t = positions ? positions[n] : static_cast<int>(n % T_len);
        T* x = qkv + n * row_stride + static_cast<int64_t>(h) * D;  // q heads, k heads, v heads are contiguous
        if (h < rotated) {
            const float c = cos_sin[static_cast<int64_t>(t) * half + i];
            const float sn = cos_sin[static_cast<int64_t>(T_len) * half + static_cast<int64_t>(t) * half + i];
            const float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
            if (!kBackward) {
                x[i] = from_float<T>(x1 * c - x2 * sn);
                x[i + half] = from_float<T>(x2 * c + x1 * sn);
            } else {  // transpose of the rotation
                x[i] = from_float<T>(x1 * c + x2 * sn);
                x[i + half] = from_float<T>(x2 * c - x1 * sn);
            }
        }
        if (amax) bits = abs_max_bits(abs_max_bits(0u, to_float(x[i])), to_float(x[i + half]));
    }
    if (amax) reduce_abs_max(amax, bits);
}

template <bool kBackward>
void launch(DType act, void* qkv, const float* cos_sin, int B, int T_len, int Hq, int Hkv, int D, cudaStream_t s,
            float* amax, const int32_t* positions) {
    const int rotated = Hq + Hkv;
    const int heads = amax ? Hq + 2 * Hkv : rotated;  // with amax, the v heads are visited (read only)
    const int row_stride = (Hq + 2 * Hkv) * D;
    const int64_t pairs = static_cast<int64_t>(B) * T_len * heads * (D / 2);
    if (amax) CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
    if (pairs == 0) return;
    QTRAIN_DISPATCH_ACT(act, E, {
        constexpr int P = Pack<E>::N;
        if ((D / 2) % P == 0 && rows_vectorizable<E>(qkv, row_stride)) {
            const int64_t total = pairs / P;
            rope_kernel_vec<E, kBackward><<<ceil_div(total, 256), 256, 0, s>>>(
                static_cast<E*>(qkv), cos_sin, T_len, heads, rotated, row_stride, D, total, amax, positions);
        } else {
            rope_kernel<E, kBackward><<<ceil_div(pairs, 256), 256, 0, s>>>(
                static_cast<E*>(qkv), cos_sin, T_len, heads, rotated, row_stride, D, pairs, amax, positions);
        }
    });
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rope_forward(DType act, void* qkv, const float* cos_sin, int B, int T, int Hq, int Hkv, int D, cudaStream_t s,
                  const int32_t* positions) {
    launch<false>(act, qkv, cos_sin, B, T, Hq, Hkv, D, s, nullptr, positions);
}

void rope_backward(DType act, void* dqkv, const float* cos_sin, int B, int T, int Hq, int Hkv, int D, cudaStream_t s,
                   float* amax, const int32_t* positions) {
    launch<true>(act, dqkv, cos_sin, B, T, Hq, Hkv, D, s, amax, positions);
}

}  // namespace qtrain::cuda
