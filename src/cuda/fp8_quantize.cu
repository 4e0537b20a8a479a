// FP8 per-tensor current scaling: abs-max, quantise, quantise + transpose (fp8.h has the convention;
// core/fp8_reference.h emulates it bit for bit on the host).
// Shape: all three are memory bound, so they are grid-stride loops over 16-byte vector loads (8 bf16
// or 4 fp32 per load) with a capped grid; the scale is computed by every thread from the device amax
// (one broadcast load: no host round trip, CUDA-graph safe). The abs-max reduces on integer bit
// patterns with one atomicMax per block (fp8_common.cuh): exact and order independent, so
// deterministic. The transpose goes through a 64 x 64 shared-memory tile of already-quantised bytes
// (4x less shared memory traffic than tiling the bf16/fp32 input), read back as 16-byte column
// segments so both the global loads and the global stores are 16-byte vectors.
#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/check.h"
#include "cuda/dispatch.cuh"
#include "cuda/fp8.h"
#include "cuda/fp8_common.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/swiglu_math.cuh"

namespace qtrain::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 2048;  // ~2 waves of 256-thread blocks on an H100/H200; fewer atomics

unsigned grid_for(int64_t items) {
    return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(items, kThreads), 1, kMaxBlocks));
}

bool aligned(const void* p, std::size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// ---- abs max ----

template <class T, bool kVec>
__global__ void abs_max_kernel(float* amax, const T* x, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t gid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    unsigned m = 0;
    int64_t done = 0;
    if constexpr (kVec) {
        constexpr int P = Pack<T>::N;
        const int64_t nv = n / P;
        for (int64_t i = gid; i < nv; i += stride) {
            Pack<T> p;
            p.load(x + i * P);
#pragma unroll
            for (int k = 0; k < P; ++k) m = abs_max_bits(m, p.v[k]);
        }
        done = nv * P;
    }
    for (int64_t i = done + gid; i < n; i += stride) m = abs_max_bits(m, to_float(x[i]));
    reduce_abs_max(amax, m);
}

// ---- quantise ----

template <class T, bool kE4M3, bool kVec>
__global__ void quantize_kernel(uint8_t* out, const T* in, int64_t n, const float* amax, float* inv_out) {
    const float scale = block_scale<kE4M3>(amax, inv_out);
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t gid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    int64_t done = 0;
    if constexpr (kVec) {
        constexpr int P = Pack<T>::N;
        const int64_t nv = n / P;
        for (int64_t i = gid; i < nv; i += stride) {
            Pack<T> p;
            p.load(in + i * P);
            uint32_t words[P / 4];
            encode_pack<kE4M3, P>(words, p.v, scale);
            store_words<P>(out + i * P, words);
        }
        done = nv * P;
    }
    for (int64_t i = done + gid; i < n; i += stride) out[i] = fp8x1<kE4M3>(__fmul_rn(to_float(in[i]), scale));
}

// ---- quantise + transpose ----

constexpr int kTile = 64;
constexpr int kTileStride = kTile + 4;  // bytes per shared row (17 words): column reads at most 2-way conflicted

// Store phase shared by the transposing kernels: thread (oc = tid / 4, seg = tid % 4) gathers
// tile[seg*16 .. seg*16+15][oc] and writes those 16 bytes of output row c0 + oc (4 threads write one
// 64-byte run).
__device__ __forceinline__ void store_tile_transposed(const uint8_t* tile, uint8_t* out_t, int64_t rows, int64_t cols,
                                                      int64_t r0, int64_t c0) {
    const int oc = threadIdx.x >> 2, seg = threadIdx.x & 3;
    const int64_t gc = c0 + oc, gr = r0 + seg * 16;
    if (gc < cols && gr < rows) {
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            uint32_t word = 0;
#pragma unroll
            for (int b = 0; b < 4; ++b)
                word |= static_cast<uint32_t>(tile[(seg * 16 + q * 4 + b) * kTileStride + oc]) << (8 * b);
            w[q] = word;
        }
        *reinterpret_cast<uint4*>(out_t + gc * rows + gr) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// Load phase shared by the quantising transposes: the block's 64 x 64 tile (origin r0, c0) in packs
// of P elements; f(r, c, gr, gc) runs for each pack inside the rows x cols matrix (tile row and
// column, global row and column). rows, cols are multiples of 16, so every pack and every 16-row
// segment is either wholly inside the matrix or wholly outside.
template <int P, class F>
__device__ __forceinline__ void for_each_tile_pack(int64_t rows, int64_t cols, int64_t r0, int64_t c0, F&& f) {
    constexpr int kPacksPerRow = kTile / P;
    for (int p = threadIdx.x; p < kTile * kPacksPerRow; p += blockDim.x) {
        const int r = p / kPacksPerRow, c = (p % kPacksPerRow) * P;
        const int64_t gr = r0 + r, gc = c0 + c;
        if (gr < rows && gc < cols) f(r, c, gr, gc);
    }
}

// P quantised bytes (P / 4 words) into tile[r][c..c+P-1].
template <int P>
__device__ __forceinline__ void put_tile_words(uint8_t* tile, int r, int c, const uint32_t (&words)[P / 4]) {
#pragma unroll
    for (int w = 0; w < P / 4; ++w) *reinterpret_cast<uint32_t*>(&tile[r * kTileStride + c + 4 * w]) = words[w];
}

// Block of 256 threads per 64 x 64 tile of `in`. Load phase: 16-byte packs of the input, quantised in
// registers, written as bytes into tile[r][c] (and to `out` when given); then store_tile_transposed.
template <class T, bool kE4M3>
__global__ void __launch_bounds__(256) quantize_transpose_kernel(uint8_t* out_t, uint8_t* out, const T* in,
                                                                 int64_t rows, int64_t cols, const float* amax,
                                                                 float* inv_out) {
    __shared__ __align__(16) uint8_t tile[kTile * kTileStride];
    const float scale = block_scale<kE4M3>(amax, inv_out);
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
    constexpr int P = Pack<T>::N;
    for_each_tile_pack<P>(rows, cols, r0, c0, [&](int r, int c, int64_t gr, int64_t gc) {
        Pack<T> v;
        v.load(in + gr * cols + gc);
        uint32_t words[P / 4];
        encode_pack<kE4M3, P>(words, v.v, scale);
        put_tile_words<P>(tile, r, c, words);
        if (out != nullptr) store_words<P>(out + gr * cols + gc, words);
    });
    __syncthreads();
    store_tile_transposed(tile, out_t, rows, cols, r0, c0);
}

// The SwiGLU backward, quantised and transposed in one pass: a block per 64 x 64 tile of the [N, I]
// grid of (dgate, dup) pairs. Load phase: 16-byte packs of dout, gate and up; the two gradients are
// computed (swiglu_math.cuh), rounded to T as swiglu_backward stores them, quantised, and written as
// bytes into two shared tiles (and row-major into out: dgate at column c, dup at I + c). Then each
// tile is stored transposed into its half of out_t ([2I, N]: dgate rows 0..I-1, dup rows I..2I-1).
template <class T, bool kE4M3>
__global__ void __launch_bounds__(256) swiglu_backward_quantize_transpose_kernel(
    uint8_t* out_t, uint8_t* out, const T* dout, const T* gate_up, int64_t N, int64_t I, const float* amax,
    float* inv_out) {
    __shared__ __align__(16) uint8_t tile_g[kTile * kTileStride];
    __shared__ __align__(16) uint8_t tile_u[kTile * kTileStride];
    const float scale = block_scale<kE4M3>(amax, inv_out);
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
    constexpr int P = Pack<T>::N;
    for_each_tile_pack<P>(N, I, r0, c0, [&](int r, int c, int64_t gr, int64_t gc) {
        Pack<T> d, g, u;
        d.load(dout + gr * I + gc);
        g.load(gate_up + gr * 2 * I + gc);
        u.load(gate_up + gr * 2 * I + I + gc);
        float dg[P], du[P];
#pragma unroll
        for (int k = 0; k < P; ++k) {
            swiglu_grads(d.v[k], g.v[k], u.v[k], dg[k], du[k]);
            dg[k] = to_float(from_float<T>(dg[k]));  // the values swiglu_backward would store
            du[k] = to_float(from_float<T>(du[k]));
        }
        uint32_t wg[P / 4], wu[P / 4];
        encode_pack<kE4M3, P>(wg, dg, scale);
        encode_pack<kE4M3, P>(wu, du, scale);
        put_tile_words<P>(tile_g, r, c, wg);
        put_tile_words<P>(tile_u, r, c, wu);
        store_words<P>(out + gr * 2 * I + gc, wg);
        store_words<P>(out + gr * 2 * I + I + gc, wu);
    });
    __syncthreads();
    store_tile_transposed(tile_g, out_t, N, I, r0, c0);
    store_tile_transposed(tile_u, out_t + I * N, N, I, r0, c0);
}

// A 64 x 64 byte matrix already in fp8 (one scale for the whole tensor): the same tiles, bytes moved
// as they are. Load phase: one 16-byte pack per thread.
__global__ void __launch_bounds__(256) transpose_bytes_kernel(uint8_t* out_t, const uint8_t* in, int64_t rows,
                                                              int64_t cols) {
    __shared__ __align__(16) uint8_t tile[kTile * kTileStride];
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
    const int r = threadIdx.x >> 2, c = (threadIdx.x & 3) * 16;
    if (r0 + r < rows && c0 + c < cols) {
        const uint4 v = *reinterpret_cast<const uint4*>(in + (r0 + r) * cols + c0 + c);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) *reinterpret_cast<uint32_t*>(&tile[r * kTileStride + c + 4 * w]) = words[w];
    }
    __syncthreads();
    store_tile_transposed(tile, out_t, rows, cols, r0, c0);
}

bool is_e4m3(DType t, const char* what) {
    QT_CHECK(is_fp8(t), what, ": output dtype must be e4m3 or e5m2, got ",
             dtype_name(t));
    return t == DType::E4M3;
}

void check_scale_pointers(const float* amax, const float* inv_scale_out, const char* what) {
    QT_CHECK(amax != nullptr, what, ": amax pointer is null");
    QT_CHECK(aligned(amax, sizeof(float)), what, ": amax pointer is not 4-byte aligned");
    QT_CHECK(inv_scale_out == nullptr || aligned(inv_scale_out, kFp8ScaleSlotBytes), what,
             ": inv_scale_out must be 16-byte aligned (cuBLASLt rejects unaligned FP8 scale pointers; give every "
             "scale its own 16-byte slot)");
}

}  // namespace

void abs_max(float* amax, DType in_type, const void* x, int64_t n, cudaStream_t s, bool accumulate) {
    QT_CHECK(amax != nullptr && aligned(amax, sizeof(float)), "abs_max: amax must be a 4-byte aligned device pointer");
    QT_CHECK(n >= 0, "abs_max: negative element count ", n);
    if (!accumulate) CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
    if (n == 0) return;
    QTRAIN_DISPATCH_ACT(in_type, T, {
        const T* xt = static_cast<const T*>(x);
        if (aligned(x, 16)) abs_max_kernel<T, true><<<grid_for(ceil_div(n, Pack<T>::N)), kThreads, 0, s>>>(amax, xt, n);
        else abs_max_kernel<T, false><<<grid_for(n), kThreads, 0, s>>>(amax, xt, n);
    });
    CUDA_CHECK(cudaGetLastError());
}

namespace {

template <bool kE4M3>
__global__ void max_over_ranks_kernel(float* amax_slots, float* inv_slots, const float* rank_amax, int count,
                                      int ranks, Fp8SlotMap map) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    unsigned m = 0u;  // on |x|'s bit pattern, as abs_max takes it (fp8_common.cuh)
    for (int r = 0; r < ranks; ++r) m = abs_max_bits(m, rank_amax[static_cast<int64_t>(r) * count + i]);
    const float amax = __uint_as_float(m);
    const int g = i / map.group, k = i % map.group;
    amax_slots[4 * (g * map.amax_group_stride + k)] = amax;
    inv_slots[4 * (g * map.inv_group_stride + k)] = fp8_inv_scale(fp8_scale_from_amax(amax, Fp8Format<kE4M3>::kMax));
}

}  // namespace

void max_over_ranks_fp8_scales(float* amax_slots, float* inv_scale_slots, const float* rank_amax, int count, int ranks,
                               Fp8SlotMap map, DType fp8_type, cudaStream_t s) {
    QT_CHECK(fp8_type == DType::E4M3 || fp8_type == DType::E5M2, "max_over_ranks_fp8_scales: fp8_type must be an FP8 "
             "dtype, got ", dtype_name(fp8_type));
    check_scale_pointers(amax_slots, inv_scale_slots, "max_over_ranks_fp8_scales");
    QT_CHECK(map.group >= 1 && count >= 0 && ranks >= 1, "max_over_ranks_fp8_scales: bad arguments");
    if (count == 0) return;
    const unsigned blocks = static_cast<unsigned>(ceil_div(count, kThreads));
    if (fp8_type == DType::E4M3)
        max_over_ranks_kernel<true><<<blocks, kThreads, 0, s>>>(amax_slots, inv_scale_slots, rank_amax, count, ranks, map);
    else
        max_over_ranks_kernel<false><<<blocks, kThreads, 0, s>>>(amax_slots, inv_scale_slots, rank_amax, count, ranks, map);
    CUDA_CHECK(cudaGetLastError());
}

void quantize_fp8(void* out, DType out_type, const void* in, DType in_type, int64_t n, const float* amax,
                  float* inv_scale_out, cudaStream_t s) {
    const bool e4m3 = is_e4m3(out_type, "quantize_fp8");
    check_scale_pointers(amax, inv_scale_out, "quantize_fp8");
    QT_CHECK(n >= 0, "quantize_fp8: negative element count ", n);
    auto* o = static_cast<uint8_t*>(out);
    QTRAIN_DISPATCH_ACT(in_type, T, {
        constexpr int P = Pack<T>::N;
        const T* it = static_cast<const T*>(in);
        const bool vec = aligned(in, 16) && aligned(out, P);
        const unsigned grid = grid_for(vec ? ceil_div(n, P) : n);
        if (e4m3) {
            if (vec) quantize_kernel<T, true, true><<<grid, kThreads, 0, s>>>(o, it, n, amax, inv_scale_out);
            else quantize_kernel<T, true, false><<<grid, kThreads, 0, s>>>(o, it, n, amax, inv_scale_out);
        } else {
            if (vec) quantize_kernel<T, false, true><<<grid, kThreads, 0, s>>>(o, it, n, amax, inv_scale_out);
            else quantize_kernel<T, false, false><<<grid, kThreads, 0, s>>>(o, it, n, amax, inv_scale_out);
        }
    });
    CUDA_CHECK(cudaGetLastError());
}

// The grid of the 64 x 64-tile kernels (a block per tile, x over columns), after checking the shape
// they rely on: every 16-byte pack and 16-row segment wholly inside or outside the matrix.
dim3 tile_grid(int64_t rows, int64_t cols, const char* what) {
    QT_CHECK(rows > 0 && cols > 0 && rows % 16 == 0 && cols % 16 == 0, what, ": rows (", rows, ") and cols (", cols,
             ") must be positive multiples of 16");
    QT_CHECK(ceil_div(rows, kTile) <= 65535, what, ": too many rows (", rows, ")");
    return dim3(static_cast<unsigned>(ceil_div(cols, kTile)), static_cast<unsigned>(ceil_div(rows, kTile)));
}

void quantize_fp8_transpose(void* out_t, DType out_type, const void* in, DType in_type, int64_t rows, int64_t cols,
                            const float* amax, float* inv_scale_out, cudaStream_t s, void* out) {
    const bool e4m3 = is_e4m3(out_type, "quantize_fp8_transpose");
    check_scale_pointers(amax, inv_scale_out, "quantize_fp8_transpose");
    const dim3 grid = tile_grid(rows, cols, "quantize_fp8_transpose");
    QT_CHECK(aligned(in, 16) && aligned(out_t, 16) && (out == nullptr || aligned(out, 16)),
             "quantize_fp8_transpose: in, out_t and out must be 16-byte aligned");
    auto* ot = static_cast<uint8_t*>(out_t);
    auto* o = static_cast<uint8_t*>(out);
    QTRAIN_DISPATCH_ACT(in_type, T, {
        const T* it = static_cast<const T*>(in);
        if (e4m3) quantize_transpose_kernel<T, true><<<grid, 256, 0, s>>>(ot, o, it, rows, cols, amax, inv_scale_out);
        else quantize_transpose_kernel<T, false><<<grid, 256, 0, s>>>(ot, o, it, rows, cols, amax, inv_scale_out);
    });
    CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward_quantize_transpose(void* out_t, void* out, DType out_type, const void* dout, const void* gate_up,
                                        DType in_type, int64_t N, int64_t I, const float* amax, float* inv_scale_out,
                                        cudaStream_t s) {
    const bool e4m3 = is_e4m3(out_type, "swiglu_backward_quantize_transpose");
    check_scale_pointers(amax, inv_scale_out, "swiglu_backward_quantize_transpose");
    const dim3 grid = tile_grid(N, I, "swiglu_backward_quantize_transpose (rows N, cols I)");
    QT_CHECK(aligned(out_t, 16) && aligned(out, 16) && aligned(dout, 16) && aligned(gate_up, 16),
             "swiglu_backward_quantize_transpose: out_t, out, dout and gate_up must be 16-byte aligned");
    auto* ot = static_cast<uint8_t*>(out_t);
    auto* o = static_cast<uint8_t*>(out);
    QTRAIN_DISPATCH_ACT(in_type, T, {
        const T* d = static_cast<const T*>(dout);
        const T* gu = static_cast<const T*>(gate_up);
        if (e4m3)
            swiglu_backward_quantize_transpose_kernel<T, true><<<grid, 256, 0, s>>>(ot, o, d, gu, N, I, amax,
                                                                                    inv_scale_out);
        else
            swiglu_backward_quantize_transpose_kernel<T, false><<<grid, 256, 0, s>>>(ot, o, d, gu, N, I, amax,
                                                                                     inv_scale_out);
    });
    CUDA_CHECK(cudaGetLastError());
}

void transpose_fp8(void* out_t, const void* in, int64_t rows, int64_t cols, cudaStream_t s) {
    const dim3 grid = tile_grid(rows, cols, "transpose_fp8");
    QT_CHECK(aligned(in, 16) && aligned(out_t, 16), "transpose_fp8: in and out_t must be 16-byte aligned");
    transpose_bytes_kernel<<<grid, 256, 0, s>>>(static_cast<uint8_t*>(out_t), static_cast<const uint8_t*>(in), rows,
                                                cols);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
