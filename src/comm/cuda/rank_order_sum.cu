// The rank-order sum on the GPU. One thread owns whole elements and adds the sources into them in
// rank order, so there is no reduction tree whose grouping could change the bits; with 16-byte
// vector loads when every pointer allows them (the sum is read-bandwidth bound: n sources, one output).
// This file is compiled without fast math (CMakeLists.txt): subnormals must not be flushed, or the
// bits would differ from the CPU's.
#include "comm/cuda/rank_order_sum_gpu.h"

#include <algorithm>
#include <cstdint>

#include "comm/cuda/cuda_call.h"
#include "core/error.h"

namespace qtrain::comm {
namespace {

// core/dtype.cpp's float_to_bf16, bit for bit: a NaN stays a quiet NaN with its payload's top bits;
// everything else rounds to nearest even (overflowing to inf as the CPU does).
__device__ __forceinline__ uint16_t bf16_rne(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

struct F32 {
    using T = float;
    static __device__ __forceinline__ float load(T x) { return x; }
    static __device__ __forceinline__ T store(float x) { return x; }
};
struct BF16 {
    using T = uint16_t;
    static __device__ __forceinline__ float load(T x) { return __uint_as_float(static_cast<uint32_t>(x) << 16); }
    static __device__ __forceinline__ T store(float x) { return bf16_rne(x); }
};

template <class D>
__device__ __forceinline__ const typename D::T* source(const RankOrderSources& s, int q) {
    using T = typename D::T;
    if (q == s.own_rank) return static_cast<const T*>(s.own);
    return static_cast<const T*>(s.staging) + static_cast<std::size_t>(q < s.own_rank ? q : q - 1) * s.stride;
}

// Elements [0, vectors * V) in 16-byte vectors (V elements each), then the rest one by one. vectors is
// 0 when a pointer is not 16-byte aligned.
template <class D>
__global__ void sum_kernel(RankOrderSources s, std::size_t vectors, std::size_t count, typename D::T* out) {
    using T = typename D::T;
    constexpr int V = 16 / sizeof(T);
    const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    for (std::size_t v = first; v < vectors; v += step) {
        float acc[V];
        uint4 raw = reinterpret_cast<const uint4*>(source<D>(s, 0))[v];
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = D::load(e[j]);
        for (int q = 1; q < s.n; ++q) {
            raw = reinterpret_cast<const uint4*>(source<D>(s, q))[v];
#pragma unroll
            for (int j = 0; j < V; ++j) acc[j] += D::load(e[j]);
        }
        uint4 packed;
        T* o = reinterpret_cast<T*>(&packed);
#pragma unroll
        for (int j = 0; j < V; ++j) o[j] = D::store(acc[j]);
        reinterpret_cast<uint4*>(out)[v] = packed;
    }
    for (std::size_t i = vectors * V + first; i < count; i += step) {
        float acc = D::load(source<D>(s, 0)[i]);
        for (int q = 1; q < s.n; ++q) acc += D::load(source<D>(s, q)[i]);
        out[i] = D::store(acc);
    }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <class D>
void launch(const RankOrderSources& s, std::size_t count, void* out, cudaStream_t stream) {
    using T = typename D::T;
    constexpr std::size_t V = 16 / sizeof(T);
    const bool vector = aligned16(s.own) && aligned16(out) &&
                        (s.n == 1 || (aligned16(s.staging) && s.stride * sizeof(T) % 16 == 0));
    const std::size_t vectors = vector ? count / V : 0;
    const std::size_t work = vectors > 0 ? vectors : count;
    constexpr std::size_t kThreads = 256, kMaxBlocks = 8192;  // grid-stride beyond that
    const std::size_t blocks = std::min(kMaxBlocks, (work + kThreads - 1) / kThreads);
    sum_kernel<D><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(s, vectors, count, static_cast<T*>(out));
    QT_COMM_CUDA(cudaGetLastError());
}

}  // namespace

void sum_in_rank_order_gpu(const RankOrderSources& sources, std::size_t count, DType dtype, void* out,
                           cudaStream_t stream) {
    QT_CHECK(sources.n >= 1 && sources.own_rank >= 0 && sources.own_rank < sources.n,
             "sum_in_rank_order_gpu: source ", sources.own_rank, " of ", sources.n, " is not a source");
    if (count == 0) return;
    switch (dtype) {
        case DType::F32: return launch<F32>(sources, count, out, stream);
        case DType::BF16: return launch<BF16>(sources, count, out, stream);
        default:
            throw_error(cat("sum_in_rank_order_gpu: sums are implemented for fp32 and bf16, got ", dtype_name(dtype)));
    }
}

}  // namespace qtrain::comm
