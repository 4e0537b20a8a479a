// Device helpers shared by the attention kernels: the few PTX instructions the flash kernels are
// built from (cp.async, ldmatrix, mma.sync m16n8k16 bf16), the padded shared-memory tile loader,
// and the backward's preprocessing kernel delta = rowsum(dout * out).
//
// Fragment conventions (PTX ISA, mma.m16n8k16, g = lane / 4, c = lane % 4):
//   A 16x16 (row-major): a0 = (g, 2c..2c+1), a1 = (g+8, 2c..), a2 = (g, 2c+8..), a3 = (g+8, 2c+8..)
//   B 16x8  ("col"):     b0 = (k 2c..2c+1, n g), b1 = (k 2c+8..2c+9, n g)
//   C 16x8  (fp32):      c0,c1 = (g, 2c..2c+1), c2,c3 = (g+8, 2c..2c+1)
// Two neighbouring C tiles (16 columns) pack into exactly one A fragment of a following product:
// that is how P and dS go from one matmul to the next without touching shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace qtrain::attn {

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1; when !valid nothing is read and zeros are written.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
// 4-byte variant (lse / delta rows, which are not 16-byte aligned when T is odd).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
                 "r"(valid ? 4 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}

// c += a * b (bf16 inputs, fp32 accumulate).
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two bf16 (lo in the low half: the lower column index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

// Accumulator tiles n0 = 2k, n0+1 = 2k+1 (16 columns) of a 16 x N product as the A fragment of the
// k-th 16-wide slice of the next product's reduction dimension.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack_bf16(c0[0], c0[1]);
    a[1] = pack_bf16(c0[2], c0[3]);
    a[2] = pack_bf16(c1[0], c1[1]);
    a[3] = pack_bf16(c1[2], c1[3]);
}

// ---- ldmatrix addressing (lane's row address) for a tile stored row-major with row stride kS ----
// A operand 16x16 at (row0, col0) of a [M][K] tile.
template <int kS>
__device__ __forceinline__ const bf16* a_frag_addr(const bf16* tile, int row0, int col0, int lane) {
    return tile + (row0 + (lane & 15)) * kS + col0 + (lane >> 4) * 8;
}
// B operand for two n-tiles (n0..n0+15) and one k-step (k0..k0+15) of a tile stored [N][K]
// (ldmatrix, no transpose): r0,r1 = b0,b1 of n-tile 0; r2,r3 = b0,b1 of n-tile 1.
template <int kS>
__device__ __forceinline__ const bf16* b_frag_addr_nk(const bf16* tile, int n0, int k0, int lane) {
    return tile + (n0 + (lane & 7) + (lane >> 4) * 8) * kS + k0 + ((lane >> 3) & 1) * 8;
}
// B operand for two n-tiles and one k-step of a tile stored [K][N] (ldmatrix .trans): same register
// order as b_frag_addr_nk.
template <int kS>
__device__ __forceinline__ const bf16* b_frag_addr_kn(const bf16* tile, int k0, int n0, int lane) {
    return tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * kS + n0 + (lane >> 4) * 8;
}

// Async load of kRows rows of D bf16 each into a shared tile with row stride kS (= D + 8: the 16-byte
// pad puts the 8 rows one ldmatrix reads in 8 different bank groups). Row r comes from token t0 + r
// at gmem + t * ld (elements); rows with t >= T are zero-filled (so padding never feeds NaN into an MMA).
template <int kRows, int D, int kThreads>
__device__ __forceinline__ void load_tile_async(bf16* smem, const bf16* gmem, int64_t ld, int t0, int T) {
    constexpr int kChunks = D / 8;  // 16-byte chunks per row
    constexpr int kS = D + 8;
    static_assert((kRows * kChunks) % kThreads == 0, "tile chunks must divide evenly among threads");
#pragma unroll
    for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
        const int c = static_cast<int>(threadIdx.x) + i * kThreads;
        const int r = c / kChunks, ch = c % kChunks;
        const int t = t0 + r;
        const bool valid = t < T;
        cp_async_16(smem + r * kS + ch * 8, gmem + static_cast<int64_t>(valid ? t : 0) * ld + ch * 8, valid);
    }
}

// ---- document masking (attention.h: positions) ----
// Query t of a packed row sees keys doc_start(t) <= s <= t, doc_start(t) = t - positions[t] (the first
// token of its document). Documents are contiguous runs, so doc_start is non-decreasing along a row:
// the first row of a tile has the tile's smallest bound and the last its largest, which is what lets
// the kernels skip whole tiles. pos_row: the row's positions (positions + b * T).
__device__ __forceinline__ int doc_start(const int32_t* __restrict__ pos_row, int t) { return t - pos_row[t]; }

// One past the last query that can see key s (the end of s's document): the smallest t in (s, T)
// whose document starts after s, or T. Binary search over the non-decreasing doc_start.
__device__ __forceinline__ int doc_end(const int32_t* __restrict__ pos_row, int s, int T) {
    int lo = s + 1, hi = T;  // the answer is in [lo, hi]; every probed mid < hi <= T is a valid index
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (doc_start(pos_row, mid) > s)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

// What a query tile's kernel (the forward's and dQ's) needs of the document bounds, read once before its
// key loop: the first key block it can see (that of its first query's document start), its thread's two
// rows' lower key bounds (rows past T keep 0: their results are dropped), and the smallest and largest
// bound among its warp's valid rows (the warp's first and last row, wq0 and wq0 + 15).
struct QueryTileDocBounds {
    int first_key_block = 0;
    int row_lo_bound[2] = {0, 0};
    int warp_min = 0, warp_max = 0;
};
template <int kBc>
__device__ __forceinline__ QueryTileDocBounds query_tile_doc_bounds(const int32_t* __restrict__ pos_row, int q0,
                                                                    int row_lo, int row_hi, int wq0, int T) {
    QueryTileDocBounds d;
    d.first_key_block = doc_start(pos_row, q0) / kBc;  // q0 < T: the grid covers T
    if (row_lo < T) d.row_lo_bound[0] = doc_start(pos_row, row_lo);
    if (row_hi < T) d.row_lo_bound[1] = doc_start(pos_row, row_hi);
    if (wq0 < T) {
        d.warp_min = doc_start(pos_row, wq0);
        d.warp_max = doc_start(pos_row, min(wq0 + 15, T - 1));
    }
    return d;
}

// ---- backward preprocessing ----
// delta[b, h, t] = sum_d dout[n, h*D + d] * out[n, h*D + d], n = b*T + t: one 8-lane team per (n, h)
// row, 16-byte loads (a warp reads 4 consecutive rows = contiguous memory), fixed-order reduction.
template <typename Elem>
__device__ __forceinline__ float dot16(const uint4& a, const uint4& b) {
    if constexpr (sizeof(Elem) == 4) {
        return __uint_as_float(a.x) * __uint_as_float(b.x) + __uint_as_float(a.y) * __uint_as_float(b.y) +
               __uint_as_float(a.z) * __uint_as_float(b.z) + __uint_as_float(a.w) * __uint_as_float(b.w);
    } else {
        const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            __nv_bfloat162 x, y;
            memcpy(&x, &av[i], 4);
            memcpy(&y, &bv[i], 4);
            const float2 fx = __bfloat1622float2(x), fy = __bfloat1622float2(y);
            s = fmaf(fx.x, fy.x, s);
            s = fmaf(fx.y, fy.y, s);
        }
        return s;
    }
}

template <typename Elem, int D>
__global__ void __launch_bounds__(256) attention_delta_kernel(float* __restrict__ delta, const Elem* __restrict__ dout,
                                                              const Elem* __restrict__ out, int T, int Hq,
                                                              int64_t rows) {
    constexpr int kElemsPerChunk = 16 / sizeof(Elem);
    constexpr int kChunks = D / kElemsPerChunk;  // 8, 16 or 32
    static_assert(kChunks % 8 == 0, "");
    const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 8) + threadIdx.x / 8;
    const int sub = threadIdx.x % 8;
    float s = 0.0f;
    if (row < rows) {
        const uint4* a = reinterpret_cast<const uint4*>(dout + row * D);
        const uint4* b = reinterpret_cast<const uint4*>(out + row * D);
#pragma unroll
        for (int i = 0; i < kChunks / 8; ++i) s += dot16<Elem>(a[sub + 8 * i], b[sub + 8 * i]);
    }
    s += __shfl_xor_sync(kFullMask, s, 4);
    s += __shfl_xor_sync(kFullMask, s, 2);
    s += __shfl_xor_sync(kFullMask, s, 1);
    if (row < rows && sub == 0) {
        const int64_t n = row / Hq;  // token
        const int h = static_cast<int>(row % Hq);
        const int64_t b = n / T;
        const int t = static_cast<int>(n % T);
        delta[(b * Hq + h) * T + t] = s;
    }
}

template <typename Elem, int D>
inline void launch_attention_delta(float* delta, const Elem* dout, const Elem* out, int B, int T, int Hq,
                                   cudaStream_t stream) {
    const int64_t rows = static_cast<int64_t>(B) * T * Hq;
    const int threads = 256;
    const int64_t blocks = (rows + threads / 8 - 1) / (threads / 8);
    attention_delta_kernel<Elem, D><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(delta, dout, out, T, Hq, rows);
}

}  // namespace qtrain::attn
