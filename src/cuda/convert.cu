// dtype conversion passes (master fp32 <-> model-dtype weights, uploads, exports).
#include "cuda/check.h"
#include "cuda/dispatch.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"

namespace qtrain::cuda {

namespace {
template <class T>
__global__ void from_f32_kernel(T* dst, const float* src, int64_t n) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        dst[i] = from_float<T>(src[i]);
}
template <class T>
__global__ void to_f32_kernel(float* dst, const T* src, int64_t n) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        dst[i] = to_float(src[i]);
}
unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 65535)); }

// 16-byte stores for the aligned bulk (p is 16-byte aligned), single bytes for the tail.
__global__ void fill_zero_kernel(unsigned char* p, int64_t bytes) {
    const int64_t n16 = bytes / 16;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    for (int64_t i = first; i < n16; i += stride) reinterpret_cast<uint4*>(p)[i] = make_uint4(0, 0, 0, 0);
    for (int64_t i = n16 * 16 + first; i < bytes; i += stride) p[i] = 0;
}
// dst += src, four floats per thread (n a multiple of 4, both 16-byte aligned: checked by the launcher);
// where `copy` (device memory) is non-null and nonzero, dst = src instead (the same bits a memcpy writes).
__global__ void add_f32_kernel(float* dst, const float* src, int64_t n4, const int32_t* copy) {
    const bool overwrite = copy && *copy != 0;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
        const float4 a = reinterpret_cast<const float4*>(src)[i];
        if (overwrite) {
            reinterpret_cast<float4*>(dst)[i] = a;
            continue;
        }
        float4 d = reinterpret_cast<float4*>(dst)[i];
        d.x += a.x, d.y += a.y, d.z += a.z, d.w += a.w;
        reinterpret_cast<float4*>(dst)[i] = d;
    }
}
// Four elements per thread: a 16-byte load of src, 8-byte access to dst (over PCIe when mapped).
// `overwrite_flag` (device memory), when non-null, decides `overwrite` on the device (CUDA graphs).
__global__ void accumulate_bf16_kernel(__nv_bfloat16* dst, const float* src, int64_t n4, bool overwrite,
                                       const int32_t* overwrite_flag, uint64_t index_base, uint32_t seed) {
    if (overwrite_flag) overwrite = *overwrite_flag != 0;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
        const float4 a = reinterpret_cast<const float4*>(src)[i];
        float x[4] = {a.x, a.y, a.z, a.w};
        if (!overwrite) {
            const uint2 d = reinterpret_cast<const uint2*>(dst)[i];
            const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&d.x);
            const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&d.y);
            x[0] += __low2float(lo), x[1] += __high2float(lo), x[2] += __low2float(hi), x[3] += __high2float(hi);
        }
        const uint64_t e = index_base + static_cast<uint64_t>(i) * 4;
        uint32_t h[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) h[k] = __bfloat16_as_ushort(bf16_stochastic(x[k], grad_rounding_bits(e, k, seed, x[k])));
        reinterpret_cast<uint2*>(dst)[i] = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
    }
}
}  // namespace

namespace {
void launch_accumulate_bf16(void* dst, const float* src, int64_t n, bool overwrite, const int32_t* overwrite_flag,
                            uint64_t index_base, uint32_t seed, cudaStream_t s) {
    if (n == 0) return;
    QT_CHECK(n % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0,
             "accumulate_bf16: n must be a multiple of 4, dst 8-byte and src 16-byte aligned");
    // PCIe-bound like add_f32: few blocks, the SMs stay with the backward pass
    accumulate_bf16_kernel<<<static_cast<unsigned>(std::min<int64_t>(ceil_div(n / 4, 256), 64)), 256, 0, s>>>(
        static_cast<__nv_bfloat16*>(dst), src, n / 4, overwrite, overwrite_flag, index_base, seed);
    CUDA_CHECK(cudaGetLastError());
}

void launch_add_f32(float* dst, const float* src, int64_t n, const int32_t* copy, cudaStream_t s) {
    if (n == 0) return;
    QT_CHECK(n % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0,
             "add_f32: n must be a multiple of 4 and both buffers 16-byte aligned");
    // The host side makes this PCIe-bound: a few blocks keep enough loads in flight, and leave the
    // SMs to the backward running next to it.
    add_f32_kernel<<<static_cast<unsigned>(std::min<int64_t>(ceil_div(n / 4, 256), 64)), 256, 0, s>>>(dst, src, n / 4,
                                                                                                      copy);
    CUDA_CHECK(cudaGetLastError());
}
}  // namespace

void accumulate_bf16(void* dst, const float* src, int64_t n, bool overwrite, uint64_t index_base, uint32_t seed,
                     cudaStream_t s) {
    launch_accumulate_bf16(dst, src, n, overwrite, nullptr, index_base, seed, s);
}

void accumulate_bf16_or_overwrite(void* dst, const float* src, int64_t n, const int32_t* overwrite, uint64_t index_base,
                                  uint32_t seed, cudaStream_t s) {
    launch_accumulate_bf16(dst, src, n, false, overwrite, index_base, seed, s);
}

void add_f32(float* dst, const float* src, int64_t n, cudaStream_t s) { launch_add_f32(dst, src, n, nullptr, s); }

void add_f32_or_copy(float* dst, const float* src, int64_t n, const int32_t* copy, cudaStream_t s) {
    launch_add_f32(dst, src, n, copy, s);
}

void fill_zero(void* p, std::size_t bytes, cudaStream_t s) {
    if (bytes == 0) return;
    QT_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, "fill_zero: the buffer must be 16-byte aligned");
    fill_zero_kernel<<<grid_for(static_cast<int64_t>(bytes / 16) + 1), 256, 0, s>>>(static_cast<unsigned char*>(p),
                                                                                     static_cast<int64_t>(bytes));
    CUDA_CHECK(cudaGetLastError());
}

void convert_from_f32(void* dst, DType dst_type, const float* src, int64_t n, cudaStream_t s) {
    if (n == 0) return;
    QTRAIN_DISPATCH_ACT(dst_type, T, from_f32_kernel<T><<<grid_for(n), 256, 0, s>>>(static_cast<T*>(dst), src, n));
    CUDA_CHECK(cudaGetLastError());
}

void convert_to_f32(float* dst, const void* src, DType src_type, int64_t n, cudaStream_t s) {
    if (n == 0) return;
    QTRAIN_DISPATCH_ACT(src_type, T, to_f32_kernel<T><<<grid_for(n), 256, 0, s>>>(dst, static_cast<const T*>(src), n));
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
