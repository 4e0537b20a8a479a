// Device helpers of the FP8 path, for the quantisation kernels (fp8_quantize.cu) and for producer
// kernels (RMSNorm, SwiGLU, ...) that fuse the amax of their output:
//
//   unsigned m = 0;                       // per thread
//   m = abs_max_bits(m, y);               // for every value y the thread produces
//   reduce_abs_max(amax, m);              // all threads of the block, once; *amax zeroed beforehand
//
// The max is taken on |x|'s bit pattern as an unsigned integer: for non-negative floats that order is
// the float order (and a NaN sorts above +inf, so NaNs propagate into amax), it is exact, it ignores
// the flush-to-zero of -use_fast_math, and an integer atomicMax makes the result independent of the
// order in which blocks finish: deterministic.
// fp8_scale_from_amax is the one definition of the scale rule (see fp8.h / core/fp8_reference.h).
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qtrain::cuda {

__device__ __forceinline__ unsigned abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }
__device__ __forceinline__ unsigned abs_max_bits(unsigned acc, float x) { return max(acc, abs_bits(x)); }

// Folds every thread's `local_bits` (an |x| bit pattern from abs_max_bits) into *amax: a warp
// reduction, a block reduction through shared memory and one atomicMax per block. Every thread of
// the block must call it (it synchronises); the block size must be a multiple of 32 (any shape).
__device__ __forceinline__ void reduce_abs_max(float* amax, unsigned local_bits) {
    __shared__ unsigned warp_max[32];
    const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int nthreads = blockDim.x * blockDim.y * blockDim.z;
    const int lane = tid & 31, warp = tid >> 5;
    unsigned v = __reduce_max_sync(0xffffffffu, local_bits);
    __syncthreads();  // warp_max may still be read by a previous call
    if (lane == 0) warp_max[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (nthreads >> 5) ? warp_max[lane] : 0u;
        v = __reduce_max_sync(0xffffffffu, v);
        // skip the atomic when the running max is already as large (most blocks, once a large
        // value has landed): the result is the same max either way
        unsigned* target = reinterpret_cast<unsigned*>(amax);
        if (lane == 0 && v != 0u && v > *reinterpret_cast<volatile unsigned*>(target)) atomicMax(target, v);
    }
}

inline constexpr float kFp8MaxScaleDevice = 0x1p100f;  // core/fp8_reference.h: kFp8MaxScale, and why

// scale = min(fmax / amax, 2^100), 1 when amax is 0 or not finite. IEEE division (__fdiv_rn: the
// library builds with -use_fast_math, whose '/' is approximate) so it equals the host's bit for bit.
__device__ __forceinline__ float fp8_scale_from_amax(float amax, float fmax) {
    const unsigned bits = __float_as_uint(amax);
    if (bits == 0u || bits >= 0x7f800000u) return 1.0f;  // +0, inf or NaN (or anything negative)
    // a subnormal amax is flushed to 0 under -ftz (-> inf) or gives inf/huge without it: clamped alike
    return fminf(__fdiv_rn(fmax, amax), kFp8MaxScaleDevice);
}
__device__ __forceinline__ float fp8_inv_scale(float scale) { return __frcp_rn(scale); }

template <bool kE4M3>
struct Fp8Format {
    static constexpr float kMax = kE4M3 ? 448.0f : 57344.0f;
    static constexpr __nv_fp8_interpretation_t kInterp = kE4M3 ? __NV_E4M3 : __NV_E5M2;
};

// Two values to two fp8 codes (round to nearest even, saturating to +-max; NaN stays NaN): `a` in
// the low byte, `b` in the high byte, so the pair stores in memory order.
template <bool kE4M3>
__device__ __forceinline__ uint16_t fp8x2(float a, float b) {
    return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, Fp8Format<kE4M3>::kInterp));
}
template <bool kE4M3>
__device__ __forceinline__ uint8_t fp8x1(float a) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(a, __NV_SATFINITE, Fp8Format<kE4M3>::kInterp));
}

// ---- the quantising kernels' encoding (fp8_quantize.cu, and kernels that write codes of what they read:
// lora_dy_grads.cu), so every writer of a tensor's codes gives the same bytes ----

// P values (P = 4 or 8) times `scale`, encoded as P fp8 bytes in P/4 little-endian words.
template <bool kE4M3, int P>
__device__ __forceinline__ void encode_pack(uint32_t (&words)[P / 4], const float* v, float scale) {
#pragma unroll
    for (int w = 0; w < P / 4; ++w) {
        const uint32_t lo = fp8x2<kE4M3>(__fmul_rn(v[4 * w + 0], scale), __fmul_rn(v[4 * w + 1], scale));
        const uint32_t hi = fp8x2<kE4M3>(__fmul_rn(v[4 * w + 2], scale), __fmul_rn(v[4 * w + 3], scale));
        words[w] = lo | (hi << 16);
    }
}
template <int P>
__device__ __forceinline__ void store_words(uint8_t* dst, const uint32_t (&words)[P / 4]) {
    if constexpr (P == 8) *reinterpret_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
    else *reinterpret_cast<uint32_t*>(dst) = words[0];
}

// The scale every block of a quantising kernel computes from the tensor's device amax; block (0, 0)
// also publishes its inverse for the GEMM.
template <bool kE4M3>
__device__ __forceinline__ float block_scale(const float* amax, float* inv_out) {
    const float scale = fp8_scale_from_amax(*amax, Fp8Format<kE4M3>::kMax);
    if (inv_out != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
        *inv_out = fp8_inv_scale(scale);
    return scale;
}

}  // namespace qtrain::cuda
