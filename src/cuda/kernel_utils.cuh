// Small device helpers shared by the elementwise kernels: element loads/stores in the two activation
// types (fp32 and bf16) with fp32 arithmetic, and warp/block reductions in a fixed order (results do
// not depend on scheduling, so every kernel built on them is deterministic).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qtrain::cuda {

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `shared` needs 32 floats. Fixed reduction tree: deterministic.
__device__ __forceinline__ float block_sum(float v, float* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // shared may still be in use by a previous reduction
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : -INFINITY;
    return warp_max(v);
}

// 32-bit integer mixer (Wellons' "lowbias32"): 64-bit multiplies are emulated on the GPU and made
// the update compute-bound (17 ms instead of ~11 for 1.5B parameters), so the stochastic-rounding
// bits come from 32-bit mixing only — one mix per element gives 16 bits for m and 16 for v.
__device__ __forceinline__ uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// Round to bf16 with probability proportional to the distance (add random low bits, truncate).
__device__ __forceinline__ __nv_bfloat16 bf16_stochastic(float x, uint32_t rnd) {
    uint32_t bits = __float_as_uint(x);
    if ((bits & 0x7f800000u) != 0x7f800000u) bits += (rnd & 0xffffu);  // finite values only
    return __ushort_as_bfloat16(static_cast<unsigned short>(bits >> 16));
}

// The stochastic-rounding bits for a gradient element summed into bf16 host memory: element k (0..3)
// of the group of four starting at flat index `first`, given the sum x being rounded. A function of
// (first, k, seed, x) only: deterministic, and independent of the launch shape.
__device__ __forceinline__ uint32_t grad_rounding_bits(uint64_t first, int k, uint32_t seed, float x) {
    const uint32_t where = mix32(static_cast<uint32_t>(first) ^ mix32(static_cast<uint32_t>(first >> 32) ^ seed));
    return mix32((where + static_cast<uint32_t>(k) * 0x9e3779b9u) ^ __float_as_uint(x));
}

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace qtrain::cuda

namespace qtrain::cuda {

// 16 bytes of elements (8 bf16 or 4 fp32) moved with one vector load/store and handled as floats.
template <class T>
struct Pack {
    static constexpr int N = 16 / sizeof(T);
    float v[N];

    __device__ __forceinline__ void load(const T* p) {
        const uint4 raw = *reinterpret_cast<const uint4*>(p);
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = to_float(e[i]);
    }
    __device__ __forceinline__ void store(T* p) const {
        uint4 raw;
        T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
        for (int i = 0; i < N; ++i) e[i] = from_float<T>(v[i]);
        *reinterpret_cast<uint4*>(p) = raw;
    }
};

// true when every row of `cols` elements of T starting at `base` is 16-byte aligned
template <class T>
inline bool rows_vectorizable(const void* base, int64_t cols) {
    return (reinterpret_cast<uintptr_t>(base) % 16 == 0) && (cols % Pack<T>::N == 0);
}

}  // namespace qtrain::cuda
