// The optimizer step: a deterministic global gradient norm (fixed grid, partials summed in order,
// final sum in double) that also computes the clip factor on the device — no host round trip
// between norm and update — and one AdamW launch over the whole flat parameter buffer. The weight
// decay flag comes from a small segment table (binary search per thread), so matrices and
// norms/biases share the launch. bf16 moments use stochastic rounding so tiny updates are not
// lost to round-to-nearest.
#include <cmath>

#include "cuda/check.h"
#include "cuda/dispatch.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"

namespace qtrain::cuda {

namespace {

constexpr int kNormBlocks = 264;
constexpr int kNormThreads = 512;

// n is a multiple of 4 and g 16-byte aligned (checked by the launcher): float4 loads.
__global__ void sum_squares_kernel(float* partials, const float* g, int64_t n) {
    __shared__ float red[32];
    float s = 0.0f;
    const float4* g4 = reinterpret_cast<const float4*>(g);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n / 4;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float4 v = g4[i];
        s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void norm_finalize_kernel(float* out, const float* partials, int count, float max_norm) {
    if (threadIdx.x != 0) return;
    double s = 0.0;
    for (int i = 0; i < count; ++i) s += partials[i];
    const float norm = static_cast<float>(sqrt(s));
    out[0] = norm;
    out[1] = (max_norm > 0.0f && norm > max_norm) ? max_norm / norm : 1.0f;
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

// Random bits for element group i0 (a multiple of 4) of step `step`: a function of (seed, step, i0)
// only, so runs are reproducible and independent of the launch shape.
__device__ __forceinline__ uint32_t group_hash(uint64_t seed, uint32_t step, uint64_t i0) {
    const uint32_t hi = mix32(static_cast<uint32_t>(i0 >> 32) ^ static_cast<uint32_t>(seed >> 32) ^ (step * 0x9e3779b9u));
    return mix32(static_cast<uint32_t>(i0) ^ static_cast<uint32_t>(seed) ^ hi);
}

// Round to bf16 with probability proportional to the distance (add random low bits, truncate).
__device__ __forceinline__ __nv_bfloat16 bf16_stochastic(float x, uint32_t rnd) {
    uint32_t bits = __float_as_uint(x);
    if ((bits & 0x7f800000u) != 0x7f800000u) bits += (rnd & 0xffffu);  // finite values only
    return __ushort_as_bfloat16(static_cast<unsigned short>(bits >> 16));
}

// Four consecutive moments as fp32 (16-byte access) or bf16 (8-byte access).
template <class MT>
__device__ __forceinline__ void load4(const void* p, int64_t i0, float out[4]) {
    if constexpr (sizeof(MT) == 4) {
        const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i0);
        out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    } else {
        const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(p) + i0);
        const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(&v.x);
        const __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&v.y);
        out[0] = __low2float(a), out[1] = __high2float(a), out[2] = __low2float(b), out[3] = __high2float(b);
    }
}

// Stores four moments; bf16 with stochastic rounding from the 16-bit random numbers rnd[k].
template <class MT>
__device__ __forceinline__ void store4(void* p, int64_t i0, const float x[4], const uint32_t rnd[4]) {
    if constexpr (sizeof(MT) == 4) {
        *reinterpret_cast<float4*>(static_cast<float*>(p) + i0) = make_float4(x[0], x[1], x[2], x[3]);
    } else {
        uint16_t h[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) h[k] = __bfloat16_as_ushort(bf16_stochastic(x[k], rnd[k]));
        *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p) + i0) =
            make_uint2(h[0] | (static_cast<uint32_t>(h[1]) << 16), h[2] | (static_cast<uint32_t>(h[3]) << 16));
    }
}

template <class WT>
__device__ __forceinline__ void store_weights4(WT* w, int64_t i0, const float p[4]) {
    if constexpr (sizeof(WT) == 4) {
        *reinterpret_cast<float4*>(w + i0) = make_float4(p[0], p[1], p[2], p[3]);
    } else {
        const __nv_bfloat162 a = __floats2bfloat162_rn(p[0], p[1]), b = __floats2bfloat162_rn(p[2], p[3]);
        *reinterpret_cast<uint2*>(w + i0) =
            make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
    }
}

// Each thread updates 4 consecutive elements. Segment starts are multiples of 4 (the GPU layout
// aligns tensors to 64 elements), so a group of 4 starts either in padding (skipped: all of it is
// padding) or in one segment; if it runs past that segment's end it runs into padding (zeros that
// stay zero under AdamW) or into the next tensor of a fused group, which has the same decay flag.
template <class MT, class VT, class WT>
__global__ void adamw_kernel(const ParamSegment* segs, int num_segs, int64_t total, float* master, const float* grad,
                             void* m, void* v, WT* weights, const float* clip, AdamWArgs a, float bc1, float bc2) {
    const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
    if (i0 >= total) return;
    int lo = 0, hi = num_segs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (segs[mid].offset <= i0) lo = mid;
        else hi = mid - 1;
    }
    const ParamSegment sg = segs[lo];
    if (i0 < sg.offset || i0 >= sg.offset + sg.size) return;  // padding between tensors
    const float wd = sg.decay ? a.weight_decay : 0.0f;
    const float cs = clip[1];
    const float4 g4 = *reinterpret_cast<const float4*>(grad + i0);
    float4 p4 = *reinterpret_cast<const float4*>(master + i0);
    const float g[4] = {g4.x * cs, g4.y * cs, g4.z * cs, g4.w * cs};
    float p[4] = {p4.x, p4.y, p4.z, p4.w};
    float mv[4], vv[4];
    load4<MT>(m, i0, mv);
    load4<VT>(v, i0, vv);
    uint32_t rm[4], rv[4];
    if constexpr (sizeof(MT) == 2 || sizeof(VT) == 2) {
        const uint32_t base = group_hash(a.seed, static_cast<uint32_t>(a.step), static_cast<uint64_t>(i0));
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t r = mix32(base + static_cast<uint32_t>(k) * 0x85ebca6bu);
            rm[k] = r & 0xffffu;
            rv[k] = r >> 16;
        }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        mv[k] = a.beta1 * mv[k] + (1.0f - a.beta1) * g[k];
        vv[k] = a.beta2 * vv[k] + (1.0f - a.beta2) * g[k] * g[k];
        p[k] -= a.lr * ((mv[k] / bc1) / (sqrtf(vv[k] / bc2) + a.eps) + wd * p[k]);
    }
    store4<MT>(m, i0, mv, rm);
    store4<VT>(v, i0, vv, rv);
    if (weights) store_weights4(weights, i0, p);
    p4 = make_float4(p[0], p[1], p[2], p[3]);
    *reinterpret_cast<float4*>(master + i0) = p4;
}

template <class MT, class VT>
void launch_adamw(const ParamSegment* segs, int num_segs, int64_t total, float* master, const float* grad, void* m,
                  void* v, void* weights, DType act, const float* clip, const AdamWArgs& a, float bc1, float bc2,
                  cudaStream_t s) {
    const unsigned blocks = ceil_div(total / 4, 256);
    QTRAIN_DISPATCH_ACT(act, WT, adamw_kernel<MT, VT, WT><<<blocks, 256, 0, s>>>(
                                     segs, num_segs, total, master, grad, m, v, static_cast<WT*>(weights), clip, a,
                                     bc1, bc2));
}

}  // namespace

int norm_partials_count() { return kNormBlocks; }

void global_norm(float* out, float* partials, const float* grad, int64_t n, float max_norm, cudaStream_t s) {
    QT_CHECK(n % 4 == 0 && reinterpret_cast<uintptr_t>(grad) % 16 == 0,
             "global_norm: the gradient buffer must be 16-byte aligned and a multiple of 4 elements (got ", n, ")");
    sum_squares_kernel<<<kNormBlocks, kNormThreads, 0, s>>>(partials, grad, n);
    norm_finalize_kernel<<<1, 32, 0, s>>>(out, partials, kNormBlocks, max_norm);
    CUDA_CHECK(cudaGetLastError());
}

void adamw_update(const ParamSegment* segs, int num_segs, int64_t total, float* master, const float* grad, void* m,
                  DType m_type, void* v, DType v_type, void* weights, DType act, const float* clip, const AdamWArgs& a,
                  cudaStream_t s) {
    if (total == 0 || num_segs == 0) return;
    QT_CHECK(total % 4 == 0 && reinterpret_cast<uintptr_t>(master) % 16 == 0 && reinterpret_cast<uintptr_t>(grad) % 16 == 0,
             "AdamW: the flat buffers must be 16-byte aligned and a multiple of 4 elements (got ", total, ")");
    const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(a.beta1), a.step));
    const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(a.beta2), a.step));
    const bool m32 = m_type == DType::F32, v32 = v_type == DType::F32;
    QT_CHECK((m32 || m_type == DType::BF16) && (v32 || v_type == DType::BF16), "AdamW: moments must be fp32 or bf16");
    if (m32 && v32) launch_adamw<float, float>(segs, num_segs, total, master, grad, m, v, weights, act, clip, a, bc1, bc2, s);
    else if (m32) launch_adamw<float, __nv_bfloat16>(segs, num_segs, total, master, grad, m, v, weights, act, clip, a, bc1, bc2, s);
    else if (v32) launch_adamw<__nv_bfloat16, float>(segs, num_segs, total, master, grad, m, v, weights, act, clip, a, bc1, bc2, s);
    else launch_adamw<__nv_bfloat16, __nv_bfloat16>(segs, num_segs, total, master, grad, m, v, weights, act, clip, a, bc1, bc2, s);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
