// Flash attention forward, bf16, causal GQA, FlashAttention-2 style on mma.sync tensor cores.
//
// Why it is shaped this way:
//  - One CTA per (query block of 128 rows, query head, batch row); 8 warps, each owning 16 query rows
//    end to end, so the online softmax (row max, row sum) lives in registers and needs only
//    shuffles inside a quad, never a CTA-wide reduction.
//  - Q is loaded once (cp.async) and kept in registers as A fragments; K and V stream through shared
//    memory in 64-key blocks, double-buffered with cp.async so the next block's loads overlap this
//    block's math. 128 query rows share each K/V block, halving L2 traffic against 64-row CTAs.
//  - S = Q K^T and O += P V are m16n8k16 bf16 MMAs with fp32 accumulation; P goes from S's
//    accumulators straight into A fragments (see attention_common.cuh), never through memory.
//  - Causal: key blocks past the CTA's last query row are never visited; warps whose 16 rows all
//    precede a key block skip it; the elementwise mask runs only on blocks that cross the diagonal.
//  - exp2 with the scale pre-multiplied by log2(e) (one FFMA + MUFU.EX2 per score); lse is turned
//    back into natural log once per row at the end.
//  - Heaviest query blocks launch first (blockIdx.x reversed) so the causal triangle's long CTAs
//    don't form the tail.
//  - Rows with t >= T (T not a multiple of 128) are zero-filled on load and never stored.
//  - Document masking (kDoc, positions given): query t also needs key >= doc_start(t). Bounds are
//    non-decreasing along the row, so the CTA starts at the key block holding its first query's
//    bound (earlier blocks are another document's), a warp skips blocks that end before its first
//    row's bound, and the elementwise mask runs only where a block crosses the diagonal or starts
//    before the warp's last row's bound. A separate instantiation: plain causal is unchanged.
#include <cmath>

#include "cuda/attention.h"
#include "cuda/attention_common.cuh"
#include "cuda/check.h"
#include "cuda/fp8_common.cuh"

namespace qtrain {
namespace attn {
namespace {

template <int D>
struct FwdTile {
    static constexpr int kWarps = 8;
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kBr = 16 * kWarps;  // query rows per CTA
    static constexpr int kBc = 64;           // keys per block
    static constexpr int kS = D + 8;         // padded smem row stride (elements)
    static constexpr int kSmemBytes = (kBr + 4 * kBc) * kS * 2;  // Q + 2 stages of K and V
};

// kAmax (FP8 training): the epilogue also folds max |O| into *amax. A separate instantiation, so the
// bf16 kernel is unchanged. For D = 64, min 2 CTAs per SM keeps the amax variant at 128 registers
// (at 129, rounded to 136 per thread, only one 256-thread CTA would fit an SM); D = 128 runs one CTA
// per SM either way.
template <int D, bool kAmax, bool kDoc>
__global__ void __launch_bounds__(FwdTile<D>::kThreads, D == 64 ? 2 : 1)
    flash_fwd_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv, int T, int Hq,
                     int Hkv, float scale_log2, float* __restrict__ amax, const int32_t* __restrict__ positions) {
    using Tile = FwdTile<D>;
    constexpr int kBr = Tile::kBr, kBc = Tile::kBc, kS = Tile::kS, kThreads = Tile::kThreads;
    constexpr int kDT = D / 8;   // 8-wide column tiles of O
    constexpr int kDK = D / 16;  // 16-wide k-steps over D
    constexpr int kNT = kBc / 8; // 8-wide column tiles of S
    constexpr float kNegInf = -INFINITY;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [kBr][kS]
    bf16* sK = sQ + kBr * kS;                       // [2][kBc][kS]
    bf16* sV = sK + 2 * kBc * kS;                   // [2][kBc][kS]

    const int qb = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
    const int h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (Hq / Hkv);
    const int64_t ld = static_cast<int64_t>(Hq + 2 * Hkv) * D;
    const bf16* seq = qkv + static_cast<int64_t>(b) * T * ld;
    const bf16* gq = seq + h * D;
    const bf16* gk = seq + (Hq + kvh) * D;
    const bf16* gv = seq + (Hq + Hkv + kvh) * D;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, c = lane & 3;
    const int q0 = qb * kBr;
    const int wq0 = q0 + warp * 16;  // first query row of this warp
    const int row_lo = wq0 + g, row_hi = wq0 + g + 8;
    const int n_kb = (min(q0 + kBr, T) - 1) / kBc + 1;  // causal: key blocks up to the last valid row
    // Document masking: the first key block (that of the CTA's first query's document start), each
    // row's lower key bound (rows past T keep 0: their results are dropped), and the smallest and
    // largest bound among the warp's valid rows (its first and last; see the header).
    // (read after Q's load is issued, so the positions' latency overlaps it)
    int j0 = 0, lo_row[2] = {0, 0}, warp_lo_min = 0, warp_lo_max = 0;

    load_tile_async<kBr, D, kThreads>(sQ, gq, ld, q0, T);
    cp_async_commit();
    if constexpr (kDoc) {
        const QueryTileDocBounds d =
            query_tile_doc_bounds<kBc>(positions + static_cast<int64_t>(b) * T, q0, row_lo, row_hi, wq0, T);
        j0 = d.first_key_block;
        lo_row[0] = d.row_lo_bound[0];
        lo_row[1] = d.row_lo_bound[1];
        warp_lo_min = d.warp_min;
        warp_lo_max = d.warp_max;
    }
    load_tile_async<kBc, D, kThreads>(sK + (j0 & 1) * kBc * kS, gk, ld, j0 * kBc, T);
    load_tile_async<kBc, D, kThreads>(sV + (j0 & 1) * kBc * kS, gv, ld, j0 * kBc, T);
    cp_async_commit();

    float o[kDT][4];
#pragma unroll
    for (int n = 0; n < kDT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {kNegInf, kNegInf};  // running max of scaled (log2-domain) scores, rows g and g+8
    float l[2] = {0.0f, 0.0f};        // this thread's partial row sums (quad-reduced at the end)
    uint32_t qf[kDK][4];

    for (int j = j0; j < n_kb; ++j) {
        if (j + 1 < n_kb) {
            const int st = (j + 1) & 1;
            load_tile_async<kBc, D, kThreads>(sK + st * kBc * kS, gk, ld, (j + 1) * kBc, T);
            load_tile_async<kBc, D, kThreads>(sV + st * kBc * kS, gv, ld, (j + 1) * kBc, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == j0) {
#pragma unroll
            for (int kk = 0; kk < kDK; ++kk) ldmatrix_x4(qf[kk], a_frag_addr<kS>(sQ, warp * 16, kk * 16, lane));
        }
        const bf16* cK = sK + (j & 1) * kBc * kS;
        const bf16* cV = sV + (j & 1) * kBc * kS;
        const int k0 = j * kBc;

        // some row of this warp sees some key of this block (with documents: not all before its bounds)
        if (wq0 < T && k0 <= wq0 + 15 && (!kDoc || k0 + kBc - 1 >= warp_lo_min)) {
            float s[kNT][4];
#pragma unroll
            for (int n = 0; n < kNT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < kDK; ++kk) {
#pragma unroll
                for (int np = 0; np < kNT / 2; ++np) {
                    uint32_t bf[4];
                    ldmatrix_x4(bf, b_frag_addr_nk<kS>(cK, np * 16, kk * 16, lane));
                    mma_16816(s[2 * np], qf[kk], bf[0], bf[1]);
                    mma_16816(s[2 * np + 1], qf[kk], bf[2], bf[3]);
                }
            }
            if (k0 + kBc - 1 > wq0) {  // block crosses this warp's diagonal: mask key > row
#pragma unroll
                for (int n = 0; n < kNT; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = k0 + n * 8 + 2 * c + (e & 1);
                        const int row = e < 2 ? row_lo : row_hi;
                        if (key > row || (kDoc && key < lo_row[e >> 1])) s[n][e] = kNegInf;
                    }
            } else if (kDoc && k0 < warp_lo_max) {  // block starts before some row's document: mask key < bound
#pragma unroll
                for (int n = 0; n < kNT; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = k0 + n * 8 + 2 * c + (e & 1);
                        if (key < lo_row[e >> 1]) s[n][e] = kNegInf;
                    }
            }
            // Online softmax in the log2 domain: x = s * scale * log2(e).
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = kNegInf;
#pragma unroll
                for (int n = 0; n < kNT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
                const float m_new = fmaxf(m[r], mx * scale_log2);
                // A row with nothing visible yet keeps m = -inf; subtract 0 then so no inf - inf.
                const float m_use = m_new == kNegInf ? 0.0f : m_new;
                const float alpha = exp2f(m[r] - m_use);
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < kNT; ++n) {
                    s[n][2 * r] = exp2f(fmaf(s[n][2 * r], scale_log2, -m_use));
                    s[n][2 * r + 1] = exp2f(fmaf(s[n][2 * r + 1], scale_log2, -m_use));
                    sum += s[n][2 * r] + s[n][2 * r + 1];
                }
                l[r] = l[r] * alpha + sum;
                m[r] = m_new;
#pragma unroll
                for (int n = 0; n < kDT; ++n) {
                    o[n][2 * r] *= alpha;
                    o[n][2 * r + 1] *= alpha;
                }
            }
            // O += P V
#pragma unroll
            for (int kk = 0; kk < kBc / 16; ++kk) {
                uint32_t pa[4];
                acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
                for (int dp = 0; dp < kDT / 2; ++dp) {
                    uint32_t bf[4];
                    ldmatrix_x4_trans(bf, b_frag_addr_kn<kS>(cV, kk * 16, dp * 16, lane));
                    mma_16816(o[2 * dp], pa, bf[0], bf[1]);
                    mma_16816(o[2 * dp + 1], pa, bf[2], bf[3]);
                }
            }
        }
        __syncthreads();  // everyone is done with this stage before it is refilled
    }

    // Epilogue: O / l as bf16, staged through this warp's own 16 rows of sQ (read only by this warp,
    // long ago) so the global stores are whole 16-byte chunks.
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(kFullMask, l[r], 1);
        l[r] += __shfl_xor_sync(kFullMask, l[r], 2);
        inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    }
    bf16* sO = sQ + warp * 16 * kS;
#pragma unroll
    for (int n = 0; n < kDT; ++n) {
        const int col = n * 8 + 2 * c;
        *reinterpret_cast<uint32_t*>(sO + g * kS + col) = pack_bf16(o[n][0] * inv[0], o[n][1] * inv[0]);
        *reinterpret_cast<uint32_t*>(sO + (g + 8) * kS + col) = pack_bf16(o[n][2] * inv[1], o[n][3] * inv[1]);
    }
    __syncwarp();
    const int64_t ldo = static_cast<int64_t>(Hq) * D;
    bf16* gout = out + static_cast<int64_t>(b) * T * ldo + h * D;
    constexpr int kChunks = D / 8;
    unsigned abs_bits = 0;  // max |O| as stored (bf16 |x| bits, shifted to fp32 bits), rows t < T only
#pragma unroll
    for (int i = 0; i < 16 * kChunks / 32; ++i) {
        const int idx = lane + 32 * i;
        const int r = idx / kChunks, ch = idx % kChunks;
        const int t = wq0 + r;
        if (t < T) {
            const uint4 v = *reinterpret_cast<const uint4*>(sO + r * kS + ch * 8);
            *reinterpret_cast<uint4*>(gout + t * ldo + ch * 8) = v;
            if constexpr (kAmax) {
                const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    abs_bits = max(abs_bits, max((words[k] & 0x7fffu) << 16, ((words[k] >> 16) & 0x7fffu) << 16));
            }
        }
    }
    if constexpr (kAmax) cuda::reduce_abs_max(amax, abs_bits);  // every thread of the block takes it
    if (c == 0) {
        float* glse = lse + (static_cast<int64_t>(b) * Hq + h) * T;
        if (row_lo < T) glse[row_lo] = (m[0] + log2f(l[0])) * kLn2;
        if (row_hi < T) glse[row_hi] = (m[1] + log2f(l[1])) * kLn2;
    }
}

template <int D>
void launch_fwd(void* out, float* lse, const void* qkv, const AttentionShape& s, cudaStream_t stream, float* amax,
                const int32_t* positions) {
    using Tile = FwdTile<D>;
    auto kernel = positions ? (amax ? flash_fwd_kernel<D, true, true> : flash_fwd_kernel<D, false, true>)
                            : (amax ? flash_fwd_kernel<D, true, false> : flash_fwd_kernel<D, false, false>);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
    const dim3 grid((s.T + Tile::kBr - 1) / Tile::kBr, s.Hq, s.B);
    const float scale_log2 = (1.0f / std::sqrt(static_cast<float>(D))) * kLog2e;
    if (amax) CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
    kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(static_cast<bf16*>(out), lse,
                                                               static_cast<const bf16*>(qkv), s.T, s.Hq, s.Hkv,
                                                               scale_log2, amax, positions);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace
}  // namespace attn

namespace detail {
void flash_attention_forward(void* out, float* lse, const void* qkv, const AttentionShape& s, cudaStream_t stream,
                             float* amax, const int32_t* positions) {
    if (s.D == 64)
        attn::launch_fwd<64>(out, lse, qkv, s, stream, amax, positions);
    else
        attn::launch_fwd<128>(out, lse, qkv, s, stream, amax, positions);
}
}  // namespace detail

}  // namespace qtrain
