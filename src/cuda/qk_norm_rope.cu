// Qwen3's per-head RMSNorm of q and k (q_norm, k_norm: one weight [D] per role, shared by all heads)
// fused with RoPE, in place on the fused qkv buffer. Unfused, the norm would be one more read and
// write of q|k in each direction; fused, each direction reads and writes q|k once, as rope.cu alone
// did (the backward also reads the saved pre-norm q|k). A head row is D values, so a small group of threads (Gr, a power of two <= 32)
// holds one row in registers: thread j owns K pairs (i, i + D/2) — one 16-byte pack of each half, as
// rope.cu's vector path — so the rotation partner of every value is in the same thread, and the row's
// sum of squares (forward) or dot product (backward) is a shuffle reduction within the group. The
// forward keeps what the backward needs: the pre-norm q|k (in the activation type, exactly the GEMM
// output) and one rstd per head row; the normalised values are never stored.
// The backward's weight gradients are deterministic like rmsnorm.cu's: a fixed number of blocks
// (a function of the shape only), each a q block or a k block walking a fixed, strided set of rows
// and keeping per-thread column sums in registers; the block adds its slots' sums in order into one
// partial row, and column_sums.cuh's column_reduce adds the partial rows in a fixed order.
// A scalar path (one warp per row, strided pairs) covers misaligned buffers and D/2 not a multiple
// of the pack, up to D = 512.
#include <algorithm>
#include <initializer_list>

#include "cuda/check.h"
#include "cuda/column_sums.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/fp8_common.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"
#include "core/error.h"

namespace qtrain::cuda {

namespace {

constexpr int kThreads = 256;
// Backward: about this many blocks in all (never more than kTargetBlocks + 1). A constant, not the
// GPU's SM count, so the weight gradients' summation order and bits are the same on every GPU.
constexpr int kTargetBlocks = 1024;
constexpr int kScalarPairs = 8;  // scalar path: pairs per lane of a 32-lane group, so D <= 2 * 32 * 8

// The pairs of a thread: the vector path's thread j owns i = j*K .. j*K+K-1 (one pack per half); the
// scalar path's lane j owns i = j, j + 32, ... (valid while i < D/2).
template <class T, bool kVec>
struct Layout {
    static constexpr int K = kVec ? Pack<T>::N : kScalarPairs;
    __device__ static int col(int j, int k, int Gr) { return kVec ? j * K + k : j + Gr * k; }
    __device__ static bool valid(int i, int half) { return kVec || i < half; }

    // a[k] = row[i_k], b[k] = row[i_k + half]; zero where not valid
    __device__ static void load(float* a, float* b, const T* row, int j, int Gr, int half) {
        if constexpr (kVec) {
            Pack<T> pa, pb;
            pa.load(row + j * K);
            pb.load(row + j * K + half);
#pragma unroll
            for (int k = 0; k < K; ++k) a[k] = pa.v[k], b[k] = pb.v[k];
        } else {
#pragma unroll
            for (int k = 0; k < K; ++k) {
                const int i = col(j, k, Gr);
                a[k] = i < half ? to_float(row[i]) : 0.0f;
                b[k] = i < half ? to_float(row[i + half]) : 0.0f;
            }
        }
    }
    __device__ static void store(T* row, const float* a, const float* b, int j, int Gr, int half) {
        if constexpr (kVec) {
            Pack<T> pa, pb;
#pragma unroll
            for (int k = 0; k < K; ++k) pa.v[k] = a[k], pb.v[k] = b[k];
            pa.store(row + j * K);
            pb.store(row + j * K + half);
        } else {
#pragma unroll
            for (int k = 0; k < K; ++k) {
                const int i = col(j, k, Gr);
                if (i < half) row[i] = from_float<T>(a[k]), row[i + half] = from_float<T>(b[k]);
            }
        }
    }
    // weights (any alignment: loaded once per thread or row, element by element)
    __device__ static void load_weight(float* a, float* b, const T* w, int j, int Gr, int half) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int i = col(j, k, Gr);
            a[k] = valid(i, half) ? to_float(w[i]) : 0.0f;
            b[k] = valid(i, half) ? to_float(w[i + half]) : 0.0f;
        }
    }
};

// Sum over the Gr lanes of an aligned group (Gr a power of two <= 32); every lane of the warp must
// call it. Fixed butterfly: deterministic.
__device__ __forceinline__ float group_sum(float v, int Gr) {
    for (int o = Gr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One group of Gr threads per head row r of the Hq + Hkv normalised heads (r = token * (Hq + Hkv) + head).
template <class T, bool kVec>
__global__ void __launch_bounds__(kThreads) qk_norm_rope_forward_kernel(
    T* qkv, T* qk_pre, float* rstd_out, const T* q_w, const T* k_w, const float* cos_sin, int T_len, int Hq,
    int heads, int row_stride, int D, int Gr, int64_t rows, float eps, const int32_t* positions) {
    using L = Layout<T, kVec>;
    constexpr int K = L::K;
    const int half = D / 2, j = threadIdx.x % Gr;
    const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / Gr) + threadIdx.x / Gr;
    const bool active = r < rows;  // no early return: every lane takes part in the shuffles
    float a[K], b[K];
    float ss = 0.0f;
    int h = 0, t = 0;
    T* x = nullptr;
    if (active) {
        const int64_t n = r / heads;
        h = static_cast<int>(r % heads);
        t = positions ? positions[n] : static_cast<int>(n % T_len);  // document masking: place in its document
        x = qkv + n * row_stride + static_cast<int64_t>(h) * D;
        L::load(a, b, x, j, Gr, half);
        if (qk_pre) L::store(qk_pre + r * D, a, b, j, Gr, half);  // values of T: stored exactly
#pragma unroll
        for (int k = 0; k < K; ++k) ss += a[k] * a[k] + b[k] * b[k];
    }
    ss = group_sum(ss, Gr);
    if (!active) return;  // after the last shuffle
    const float rs = rsqrtf(ss / static_cast<float>(D) + eps);
    if (rstd_out && j == 0) rstd_out[r] = rs;
    float wa[K], wb[K];
    L::load_weight(wa, wb, h < Hq ? q_w : k_w, j, Gr, half);
    const float* cs = cos_sin + static_cast<int64_t>(t) * half;
    const float* sn = cos_sin + static_cast<int64_t>(T_len) * half + static_cast<int64_t>(t) * half;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int i = L::col(j, k, Gr);
        if (!L::valid(i, half)) continue;
        const float c = cs[i], s = sn[i];
        const float ya = wa[k] * (a[k] * rs), yb = wb[k] * (b[k] * rs);  // HF: weight * (x * rstd)
        a[k] = ya * c - yb * s;
        b[k] = yb * c + ya * s;
    }
    L::store(x, a, b, j, Gr, half);  // rounded to T once
}

// Blocks [0, Gq) walk the N*Hq q rows, blocks [Gq, Gq + Gk) the N*Hkv k rows; a block's slot s
// (group of Gr threads) takes rows lb*S + s, then + G*S, ... of its part. Per row: g = the inverse
// rotation of dy, then dx = rs*w*g - rs^3/D * x * sum(w*g*x) (written over dy) and dw += g*x*rs.
// partial[blockIdx.x, D] gets the block's weight-gradient sums (slots added in order). amax (FP8
// gradients; may be null): max |dqkv| as stored over the whole tensor, the v heads (only read) too.
template <class T, bool kVec>
__global__ void __launch_bounds__(kThreads) qk_norm_rope_backward_kernel(
    T* dqkv, float* partial, const T* qk_pre, const float* rstd, const T* q_w, const T* k_w, const float* cos_sin,
    int64_t N, int T_len, int Hq, int Hkv, int row_stride, int D, int Gr, int Gq, int Gk, float* amax,
    const int32_t* positions) {
    using L = Layout<T, kVec>;
    constexpr int K = L::K;
    __shared__ float red[2 * kThreads * K];  // [S, D]: S * D <= (kThreads / Gr) * (2 * Gr * K)
    const int half = D / 2, j = threadIdx.x % Gr, S = blockDim.x / Gr, slot = threadIdx.x / Gr;
    const bool is_q = static_cast<int>(blockIdx.x) < Gq;
    const int G = is_q ? Gq : Gk, lb = is_q ? blockIdx.x : blockIdx.x - Gq;
    const int part_heads = is_q ? Hq : Hkv, head0 = is_q ? 0 : Hq, heads = Hq + Hkv;
    const int64_t rows = N * part_heads;
    float wa[K], wb[K], dwa[K], dwb[K];
    L::load_weight(wa, wb, is_q ? q_w : k_w, j, Gr, half);
#pragma unroll
    for (int k = 0; k < K; ++k) dwa[k] = dwb[k] = 0.0f;
    unsigned m = 0;  // abs-max bits of what this thread stored / read
    for (int64_t base = static_cast<int64_t>(lb) * S; base < rows; base += static_cast<int64_t>(G) * S) {  // uniform
        const int64_t rr = base + slot;
        const bool active = rr < rows;
        float ga[K], gb[K], xa[K], xb[K];
        float dot = 0.0f, rs = 0.0f;
        T* d = nullptr;
        if (active) {
            const int64_t n = rr / part_heads;
            const int h = head0 + static_cast<int>(rr % part_heads);
            const int t = positions ? positions[n] : static_cast<int>(n % T_len);
            const int64_t qr = n * heads + h;  // the row of qk_pre and rstd
            d = dqkv + n * row_stride + static_cast<int64_t>(h) * D;
            L::load(ga, gb, d, j, Gr, half);
            L::load(xa, xb, qk_pre + qr * D, j, Gr, half);
            rs = rstd[qr];
            const float* cs = cos_sin + static_cast<int64_t>(t) * half;
            const float* sn = cos_sin + static_cast<int64_t>(T_len) * half + static_cast<int64_t>(t) * half;
#pragma unroll
            for (int k = 0; k < K; ++k) {
                const int i = L::col(j, k, Gr);
                if (!L::valid(i, half)) continue;
                const float c = cs[i], s = sn[i], ya = ga[k], yb = gb[k];
                ga[k] = ya * c + yb * s;  // the transpose of the rotation
                gb[k] = yb * c - ya * s;
                dot += wa[k] * ga[k] * xa[k] + wb[k] * gb[k] * xb[k];
            }
        }
        dot = group_sum(dot, Gr);
        if (active) {
            const float kk = rs * rs * rs * dot / static_cast<float>(D);
#pragma unroll
            for (int k = 0; k < K; ++k) {
                dwa[k] += ga[k] * xa[k] * rs;
                dwb[k] += gb[k] * xb[k] * rs;
                ga[k] = rs * wa[k] * ga[k] - kk * xa[k];
                gb[k] = rs * wb[k] * gb[k] - kk * xb[k];
            }
            L::store(d, ga, gb, j, Gr, half);
            if (amax) {
#pragma unroll
                for (int k = 0; k < K; ++k) {  // the values as stored (rounded to T; invalid ones are 0)
                    m = abs_max_bits(m, to_float(from_float<T>(ga[k])));
                    m = abs_max_bits(m, to_float(from_float<T>(gb[k])));
                }
            }
        }
    }
    // the block's weight-gradient partial row: per column, the slots' sums in slot order
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int i = L::col(j, k, Gr);
        if (!L::valid(i, half)) continue;
        red[slot * D + i] = dwa[k];
        red[slot * D + i + half] = dwb[k];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float s = 0.0f;
        for (int sl = 0; sl < S; ++sl) s += red[sl * D + c];
        partial[static_cast<int64_t>(blockIdx.x) * D + c] = s;
    }
    if (amax) {  // uniform branch: every thread reaches reduce_abs_max
        // the v heads, unchanged, read for the amax only (grid-stride over all blocks)
        const int64_t per_token = static_cast<int64_t>(Hkv) * D, total = N * per_token;
        const int64_t v0 = static_cast<int64_t>(heads) * D;
        const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
        if constexpr (kVec) {
            constexpr int P = Pack<T>::N;
            for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p * P < total; p += stride) {
                const int64_t e = p * P, n = e / per_token;
                Pack<T> v;
                v.load(dqkv + n * row_stride + v0 + (e - n * per_token));
#pragma unroll
                for (int k = 0; k < P; ++k) m = abs_max_bits(m, v.v[k]);
            }
        } else {
            for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
                const int64_t n = e / per_token;
                m = abs_max_bits(m, to_float(dqkv[n * row_stride + v0 + (e - n * per_token)]));
            }
        }
        reduce_abs_max(amax, m);
    }
}

// Threads per head row: the vector path's D/2 / pack when that is a power of two <= 32 and every
// row is 16-byte aligned; otherwise 0 (the scalar path, 32 lanes per row).
template <class T>
int vector_group(int D, std::initializer_list<const void*> rows_16b_aligned) {
    constexpr int P = Pack<T>::N;
    const int half = D / 2;
    if (half % P != 0) return 0;
    const int g = half / P;
    if (g > 32 || (g & (g - 1)) != 0) return 0;
    for (const void* p : rows_16b_aligned)
        if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return 0;
    return g;  // D % P == 0, so every row offset (a multiple of D) keeps the alignment
}

void check_shape(const char* what, int D) {
    QT_CHECK(D > 0 && D % 2 == 0 && D <= 2 * 32 * kScalarPairs, what, ": head_dim ", D,
             " is not supported (even, at most ", 2 * 32 * kScalarPairs, ")");
}

// The backward's block split: a function of the shape (and of the rows per block iteration S) only.
struct BackwardGrid {
    int Gq, Gk;
};
BackwardGrid backward_grid(int64_t N, int Hq, int Hkv, int S) {
    const int64_t rq = N * Hq, rk = N * Hkv, per_iter = static_cast<int64_t>(S) * kTargetBlocks;
    const int64_t iters = std::max<int64_t>(1, (rq + rk + per_iter - 1) / per_iter);
    const int64_t rows_per_block = static_cast<int64_t>(S) * iters;
    return {static_cast<int>((rq + rows_per_block - 1) / rows_per_block),
            static_cast<int>((rk + rows_per_block - 1) / rows_per_block)};
}

}  // namespace

void qk_norm_rope_forward(DType act, void* qkv, void* qk_pre, float* rstd, const void* q_w, const void* k_w,
                          const float* cos_sin, int B, int T, int Hq, int Hkv, int D, float eps, cudaStream_t s,
                          const int32_t* positions) {
    check_shape("qk_norm_rope_forward", D);
    const int heads = Hq + Hkv, row_stride = (Hq + 2 * Hkv) * D;
    const int64_t rows = static_cast<int64_t>(B) * T * heads;
    if (rows == 0) return;
    QTRAIN_DISPATCH_ACT(act, E, {
        const int g = rows_vectorizable<E>(qkv, row_stride) ? vector_group<E>(D, {qkv, qk_pre}) : 0;
        const int Gr = g > 0 ? g : 32;
        const unsigned blocks = ceil_div(rows, kThreads / Gr);
        auto run = [&](auto kernel) {
            kernel<<<blocks, kThreads, 0, s>>>(static_cast<E*>(qkv), static_cast<E*>(qk_pre), rstd,
                                               static_cast<const E*>(q_w), static_cast<const E*>(k_w), cos_sin, T,
                                               Hq, heads, row_stride, D, Gr, rows, eps, positions);
        };
        if (g > 0)
            run(qk_norm_rope_forward_kernel<E, true>);
        else
            run(qk_norm_rope_forward_kernel<E, false>);
    });
    CUDA_CHECK(cudaGetLastError());
}

std::size_t qk_norm_rope_backward_scratch_floats(int B, int T, int Hq, int Hkv, int D) {
    const int64_t rows = static_cast<int64_t>(B) * T * (Hq + Hkv);
    return static_cast<std::size_t>(std::min<int64_t>(kTargetBlocks + 2, rows)) * static_cast<std::size_t>(D);
}

void qk_norm_rope_backward(DType act, void* d_qkv, float* dw_q, float* dw_k, float* col_scratch, const void* qk_pre,
                           const float* rstd, const void* q_w, const void* k_w, const float* cos_sin, int B, int T,
                           int Hq, int Hkv, int D, cudaStream_t s, float* grad_amax, const int32_t* positions) {
    check_shape("qk_norm_rope_backward", D);
    if (grad_amax) CUDA_CHECK(cudaMemsetAsync(grad_amax, 0, sizeof(float), s));
    const int64_t N = static_cast<int64_t>(B) * T;
    if (N == 0) return;
    const int row_stride = (Hq + 2 * Hkv) * D;
    QTRAIN_DISPATCH_ACT(act, E, {
        const int g = rows_vectorizable<E>(d_qkv, row_stride) ? vector_group<E>(D, {d_qkv, qk_pre}) : 0;
        const int Gr = g > 0 ? g : 32;
        const BackwardGrid grid = backward_grid(N, Hq, Hkv, kThreads / Gr);
        auto run = [&](auto kernel) {
            kernel<<<grid.Gq + grid.Gk, kThreads, 0, s>>>(
                static_cast<E*>(d_qkv), col_scratch, static_cast<const E*>(qk_pre), rstd, static_cast<const E*>(q_w),
                static_cast<const E*>(k_w), cos_sin, N, T, Hq, Hkv, row_stride, D, Gr, grid.Gq, grid.Gk, grad_amax,
                positions);
        };
        if (g > 0)
            run(qk_norm_rope_backward_kernel<E, true>);
        else
            run(qk_norm_rope_backward_kernel<E, false>);
        if (dw_q) column_reduce(dw_q, col_scratch, grid.Gq, D, s);  // (null: frozen, LoRA)
        if (dw_k) column_reduce(dw_k, col_scratch + static_cast<int64_t>(grid.Gq) * D, grid.Gk, D, s);
    });
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
