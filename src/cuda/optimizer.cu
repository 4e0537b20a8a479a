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

__global__ void sum_squares_kernel(float* partials, const float* g, int64_t n) {
    __shared__ float red[32];
    float s = 0.0f;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        s += g[i] * g[i];
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

__device__ __forceinline__ uint32_t hash3(uint64_t seed, uint32_t step, uint64_t i) {
    uint64_t z = seed ^ (static_cast<uint64_t>(step) * 0x9e3779b97f4a7c15ull) ^ (i * 0xbf58476d1ce4e5b9ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<uint32_t>(z ^ (z >> 31));
}

// Round to bf16 with probability proportional to the distance (add random low bits, truncate).
__device__ __forceinline__ __nv_bfloat16 bf16_stochastic(float x, uint32_t rnd) {
    uint32_t bits = __float_as_uint(x);
    if ((bits & 0x7f800000u) != 0x7f800000u) bits += (rnd & 0xffffu);  // finite values only
    return __ushort_as_bfloat16(static_cast<unsigned short>(bits >> 16));
}

template <class MT>
__device__ __forceinline__ void store_moment(void* p, int64_t i, float x, uint32_t rnd) {
    if constexpr (sizeof(MT) == 4) static_cast<float*>(p)[i] = x;
    else static_cast<__nv_bfloat16*>(p)[i] = bf16_stochastic(x, rnd);
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
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        mv[k] = to_float(static_cast<const MT*>(m)[i0 + k]);
        vv[k] = to_float(static_cast<const VT*>(v)[i0 + k]);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int64_t i = i0 + k;
        mv[k] = a.beta1 * mv[k] + (1.0f - a.beta1) * g[k];
        vv[k] = a.beta2 * vv[k] + (1.0f - a.beta2) * g[k] * g[k];
        const uint32_t r = hash3(a.seed, static_cast<uint32_t>(a.step), static_cast<uint64_t>(i));
        store_moment<MT>(m, i, mv[k], r);
        store_moment<VT>(v, i, vv[k], r * 0x9e3779b9u + 0x7f4a7c15u);
        p[k] -= a.lr * ((mv[k] / bc1) / (sqrtf(vv[k] / bc2) + a.eps) + wd * p[k]);
        if (weights) weights[i] = from_float<WT>(p[k]);
    }
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
