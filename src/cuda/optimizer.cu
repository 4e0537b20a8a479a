// The optimizer step: a deterministic global gradient norm (fixed grid, partials summed in order,
// final sum in double) that also computes the clip factor on the device — no host round trip
// between norm and update — and one AdamW launch over the whole flat parameter buffer. The weight
// decay flag comes from a small segment table (binary search per thread), so matrices and
// norms/biases share the launch. bf16 moments use stochastic rounding so tiny updates are not
// lost to round-to-nearest.
#include <cmath>

#include "cuda/check.h"
#include "cuda/dispatch.cuh"
#include "cuda/fp8_common.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"

namespace qtrain::cuda {

namespace {

constexpr int kNormBlocks = 264;
constexpr int kNormThreads = 512;

__global__ void norm_finalize_kernel(float* out, const float* partials, int count, float max_norm) {
    if (threadIdx.x != 0) return;
    double s = 0.0;
    for (int i = 0; i < count; ++i) s += partials[i];
    const float norm = static_cast<float>(sqrt(s));
    out[0] = norm;
    out[1] = (max_norm > 0.0f && norm > max_norm) ? max_norm / norm : 1.0f;
}

// Random bits for element group i0 (a multiple of 4) of step `step`: a function of (seed, step, i0)
// only, so runs are reproducible and independent of the launch shape.
__device__ __forceinline__ uint32_t group_hash(uint64_t seed, uint32_t step, uint64_t i0) {
    const uint32_t hi = mix32(static_cast<uint32_t>(i0 >> 32) ^ static_cast<uint32_t>(seed >> 32) ^ (step * 0x9e3779b9u));
    return mix32(static_cast<uint32_t>(i0) ^ static_cast<uint32_t>(seed) ^ hi);
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

// n is a multiple of 4 and g 16-byte aligned (checked by the launcher): 4 gradients per load
// (fp32, or bf16 with --param-grad-dtype=bf16).
template <class GT>
__global__ void sum_squares_kernel(float* partials, const void* g, int64_t n) {
    __shared__ float red[32];
    float s = 0.0f;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n / 4;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        float v[4];
        load4<GT>(g, i * 4, v);
        s += v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
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

// Four bf16 weights as fp32 (8-byte access).
__device__ __forceinline__ void load_bf16x4(const __nv_bfloat16* w, int64_t i0, float out[4]) {
    const uint2 v = *reinterpret_cast<const uint2*>(w + i0);
    const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(&v.x);
    const __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&v.y);
    out[0] = __low2float(a), out[1] = __high2float(a), out[2] = __low2float(b), out[3] = __high2float(b);
}

// AdamW on the 4 elements at absolute index i0 (segments, random bits), stored at index ir of the
// arrays; returns the |x| bit-pattern max of the weights as stored (for the FP8 weight amax).
template <class MT, class VT, class GT, class WT, bool kMaster32>
__device__ __forceinline__ unsigned adamw_group(int64_t i0, int64_t ir, const ParamSegment& sg, float* master,
                                                const void* grad, void* m, void* v, WT* weights, const float* clip,
                                                const AdamWArgs& a, float bc1, float bc2) {
    const float wd = sg.decay ? a.weight_decay : 0.0f;
    const float cs = clip[1];
    float g[4];
    load4<GT>(grad, ir, g);
#pragma unroll
    for (int k = 0; k < 4; ++k) g[k] *= cs;
    float p[4];
    if constexpr (kMaster32) {
        const float4 p4 = *reinterpret_cast<const float4*>(master + ir);
        p[0] = p4.x, p[1] = p4.y, p[2] = p4.z, p[3] = p4.w;
    } else {
        load_bf16x4(weights, ir, p);
    }
    float mv[4], vv[4];
    load4<MT>(m, ir, mv);
    load4<VT>(v, ir, vv);
    uint32_t rm[4], rv[4], rw[4];
    if constexpr (sizeof(MT) == 2 || sizeof(VT) == 2 || !kMaster32) {
        const uint32_t base = group_hash(a.seed, static_cast<uint32_t>(a.step), static_cast<uint64_t>(i0));
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t r = mix32(base + static_cast<uint32_t>(k) * 0x85ebca6bu);
            rm[k] = r & 0xffffu;
            rv[k] = r >> 16;
            if constexpr (!kMaster32) rw[k] = mix32(r ^ 0x68e31da4u) & 0xffffu;  // independent of m's and v's bits
        }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        mv[k] = a.beta1 * mv[k] + (1.0f - a.beta1) * g[k];
        vv[k] = a.beta2 * vv[k] + (1.0f - a.beta2) * g[k] * g[k];
        p[k] -= a.lr * ((mv[k] / bc1) / (sqrtf(vv[k] / bc2) + a.eps) + wd * p[k]);
    }
    store4<MT>(m, ir, mv, rm);
    store4<VT>(v, ir, vv, rv);
    // the weights as stored (what the FP8 quantisation will read): their |x| bit-pattern max
    float stored[4];
    if constexpr (kMaster32) {
        *reinterpret_cast<float4*>(master + ir) = make_float4(p[0], p[1], p[2], p[3]);
        if (weights) {
            store_weights4(weights, ir, p);
#pragma unroll
            for (int k = 0; k < 4; ++k) stored[k] = to_float(from_float<WT>(p[k]));
        } else {
#pragma unroll
            for (int k = 0; k < 4; ++k) stored[k] = p[k];  // fp32 model: the master is the weights
        }
    } else {
        uint16_t hb[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const __nv_bfloat16 q = bf16_stochastic(p[k], rw[k]);
            hb[k] = __bfloat16_as_ushort(q);
            stored[k] = __bfloat162float(q);
        }
        *reinterpret_cast<uint2*>(weights + ir) =
            make_uint2(hb[0] | (static_cast<uint32_t>(hb[1]) << 16), hb[2] | (static_cast<uint32_t>(hb[3]) << 16));
    }
    unsigned bits = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) bits = abs_max_bits(bits, stored[k]);
    return bits;
}

// *amax = max(*amax, bits) as |x| bit patterns. All the warps of a matrix fold into one address, so
// an atomic each would serialise in L2 (0.5B: ~4M atomics on 96 addresses per step); a plain read
// first skips the atomic when the value there is already at least as large, which after the first
// few warps is nearly always. A stale read only costs an atomic, never a wrong maximum.
__device__ __forceinline__ void fold_amax(float* amax, unsigned bits) {
    unsigned* p = reinterpret_cast<unsigned*>(amax);
    if (bits != 0u && bits > __ldcg(p)) atomicMax(p, bits);
}

// Each thread updates 4 consecutive elements. Segment starts are multiples of 4 (the GPU layout
// aligns tensors to 64 elements), so a group of 4 starts either in padding (skipped: all of it is
// padding) or in one segment; if it runs past that segment's end it runs into padding (zeros that
// stay zero under AdamW) or into the next tensor of a fused group, which has the same decay flag
// (and FP8 amax slot).
// kMaster32: the parameters are the fp32 master (and `weights`, if set, its rounded copy); else
// (--master-dtype=bf16) the bf16 `weights` are the parameters, read and written back with
// stochastic rounding, so updates far below one bf16 ulp still move them on average.
// The thread's absolute element index i0 (segments, random bits) runs over [begin, end); the arrays
// are indexed relative to begin (ir = i0 - begin), so a chunk of host-resident state staged on the
// device is updated exactly as in one launch over everything (begin = 0).
// weight_amax (FP8, may be null): each segment with an amax slot folds max |stored weight| into
// weight_amax[4 * slot] — one atomicMax per warp when the warp lies in one slot (almost always),
// per thread otherwise. No thread returns early: the whole warp takes part in the reduction.
template <class MT, class VT, class GT, class WT, bool kMaster32>
__global__ void adamw_kernel(const ParamSegment* segs, int num_segs, int64_t begin, int64_t end, float* master,
                             const void* grad, void* m, void* v, WT* weights, const float* clip, AdamWArgs a, float bc1,
                             float bc2, float* weight_amax) {
    const int64_t i0 = begin + (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
    constexpr float zero4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    unsigned bits = 0;
    int slot = -1;
    if (i0 < end) {
        int lo = 0, hi = num_segs - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (segs[mid].offset <= i0) lo = mid;
            else hi = mid - 1;
        }
        const ParamSegment sg = segs[lo];
        if (i0 >= sg.offset && i0 < sg.offset + sg.size) {
            bits = adamw_group<MT, VT, GT, WT, kMaster32>(i0, i0 - begin, sg, master, grad, m, v, weights, clip, a, bc1,
                                                          bc2);
            slot = sg.amax_slot;
        } else if constexpr (kMaster32) {
            // padding between tensors: the rounded weights are written (zeros, as the padding always
            // is) because a staged chunk of them is write-only and goes back to host memory whole
            if (weights) store_weights4(weights, i0 - begin, zero4);
        }
    }
    if (!weight_amax) return;  // uniform over the grid
    const int slot0 = __shfl_sync(0xffffffffu, slot, 0);
    if (__all_sync(0xffffffffu, slot == slot0)) {
        bits = __reduce_max_sync(0xffffffffu, bits);
        if ((threadIdx.x & 31) == 0 && slot0 >= 0) fold_amax(weight_amax + 4 * slot0, bits);
    } else if (slot >= 0) {
        fold_amax(weight_amax + 4 * slot, bits);
    }
}

template <class MT, class VT, class GT>
void launch_adamw(const ParamSegment* segs, int num_segs, int64_t begin, int64_t end, float* master, const void* grad,
                  void* m, void* v, void* weights, DType act, const float* clip, const AdamWArgs& a, float bc1,
                  float bc2, float* weight_amax, cudaStream_t s) {
    const unsigned blocks = ceil_div((end - begin) / 4, 256);
    if (!master) {  // bf16 weights are the master
        adamw_kernel<MT, VT, GT, __nv_bfloat16, false><<<blocks, 256, 0, s>>>(
            segs, num_segs, begin, end, nullptr, grad, m, v, static_cast<__nv_bfloat16*>(weights), clip, a, bc1, bc2,
            weight_amax);
        return;
    }
    QTRAIN_DISPATCH_ACT(act, WT, adamw_kernel<MT, VT, GT, WT, true><<<blocks, 256, 0, s>>>(
                                     segs, num_segs, begin, end, master, grad, m, v, static_cast<WT*>(weights), clip,
                                     a, bc1, bc2, weight_amax));
}

template <class MT, class VT>
void launch_adamw_grads(DType grad_type, const ParamSegment* segs, int num_segs, int64_t begin, int64_t end,
                        float* master, const void* grad, void* m, void* v, void* weights, DType act, const float* clip,
                        const AdamWArgs& a, float bc1, float bc2, float* weight_amax, cudaStream_t s) {
    if (grad_type == DType::F32)
        launch_adamw<MT, VT, float>(segs, num_segs, begin, end, master, grad, m, v, weights, act, clip, a, bc1, bc2,
                                    weight_amax, s);
    else
        launch_adamw<MT, VT, __nv_bfloat16>(segs, num_segs, begin, end, master, grad, m, v, weights, act, clip, a, bc1,
                                            bc2, weight_amax, s);
}

}  // namespace

int norm_partials_count() { return kNormBlocks; }

void sum_squares_partials(float* partials, const void* grad, DType grad_type, int64_t n, cudaStream_t s) {
    QT_CHECK(n % 4 == 0 && reinterpret_cast<uintptr_t>(grad) % 16 == 0,
             "global_norm: the gradient buffer must be 16-byte aligned and a multiple of 4 elements (got ", n, ")");
    QT_CHECK(grad_type == DType::F32 || grad_type == DType::BF16, "global_norm: gradients must be fp32 or bf16");
    if (grad_type == DType::F32) sum_squares_kernel<float><<<kNormBlocks, kNormThreads, 0, s>>>(partials, grad, n);
    else sum_squares_kernel<__nv_bfloat16><<<kNormBlocks, kNormThreads, 0, s>>>(partials, grad, n);
    CUDA_CHECK(cudaGetLastError());
}

void norm_from_partials(float* out, const float* partials, int count, float max_norm, cudaStream_t s) {
    norm_finalize_kernel<<<1, 32, 0, s>>>(out, partials, count, max_norm);
    CUDA_CHECK(cudaGetLastError());
}

void global_norm(float* out, float* partials, const void* grad, DType grad_type, int64_t n, float max_norm,
                 cudaStream_t s) {
    sum_squares_partials(partials, grad, grad_type, n, s);
    norm_from_partials(out, partials, kNormBlocks, max_norm, s);
}

void adamw_update(const ParamSegment* segs, int num_segs, int64_t total, float* master, const void* grad,
                  DType grad_type, void* m, DType m_type, void* v, DType v_type, void* weights, DType act,
                  const float* clip, const AdamWArgs& a, float* weight_amax, cudaStream_t s) {
    adamw_update_range(segs, num_segs, 0, total, master, grad, grad_type, m, m_type, v, v_type, weights, act, clip, a,
                       weight_amax, s);
}

void adamw_update_range(const ParamSegment* segs, int num_segs, int64_t begin, int64_t end, float* master,
                        const void* grad, DType grad_type, void* m, DType m_type, void* v, DType v_type, void* weights,
                        DType act, const float* clip, const AdamWArgs& a, float* weight_amax, cudaStream_t s) {
    if (end <= begin || num_segs == 0) return;
    auto aligned = [](const void* p, std::size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
    QT_CHECK(begin % 4 == 0 && end % 4 == 0 && aligned(master, 16) && aligned(grad, 16) && aligned(weights, 8) &&
                 aligned(m, 8) && aligned(v, 8),
             "AdamW: the buffers must be 16-byte aligned and the range [", begin, ", ", end,
             ") a multiple of 4 elements");
    QT_CHECK(master || (weights && act == DType::BF16), "AdamW: without an fp32 master the bf16 weights are the master");
    const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(a.beta1), a.step));
    const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(a.beta2), a.step));
    const bool m32 = m_type == DType::F32, v32 = v_type == DType::F32;
    QT_CHECK(grad_type == DType::F32 || grad_type == DType::BF16, "AdamW: gradients must be fp32 or bf16");
    QT_CHECK((m32 || m_type == DType::BF16) && (v32 || v_type == DType::BF16), "AdamW: moments must be fp32 or bf16");
    if (m32 && v32)
        launch_adamw_grads<float, float>(grad_type, segs, num_segs, begin, end, master, grad, m, v, weights, act, clip,
                                         a, bc1, bc2, weight_amax, s);
    else if (m32)
        launch_adamw_grads<float, __nv_bfloat16>(grad_type, segs, num_segs, begin, end, master, grad, m, v, weights,
                                                 act, clip, a, bc1, bc2, weight_amax, s);
    else if (v32)
        launch_adamw_grads<__nv_bfloat16, float>(grad_type, segs, num_segs, begin, end, master, grad, m, v, weights,
                                                 act, clip, a, bc1, bc2, weight_amax, s);
    else
        launch_adamw_grads<__nv_bfloat16, __nv_bfloat16>(grad_type, segs, num_segs, begin, end, master, grad, m, v,
                                                         weights, act, clip, a, bc1, bc2, weight_amax, s);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
