// Flash attention backward, bf16, causal GQA, on mma.sync tensor cores. Deterministic by
// construction: every output element is produced by exactly one warp, summed in a fixed order.
//
// Why it is shaped this way:
//  - Three kernels. (1) delta = rowsum(dout * out) per query row (FlashAttention-2's preprocessing;
//    it equals sum_s P*dP, the term every dS needs). (2) dK/dV: one CTA per (64-key block, kv head,
//    batch row) loops over the group's query heads and their query blocks in a fixed order,
//    accumulating dK and dV in registers. (3) dQ: one CTA per (64-row query block, query head, batch
//    row) loops over the key blocks. The usual alternative (dQ by atomicAdd from the dK/dV kernel)
//    saves recomputing S and dP (7 instead of 5 matmul-units of work) but is not bit-reproducible;
//    GQA makes the dK/dV side the natural owner (it sums over the group's heads without atomics).
//  - The dK/dV kernel computes the TRANSPOSED products S^T = K Q^T and dP^T = V dO^T, with each warp
//    owning 16 keys: then P^T and dS^T come out of the accumulators already in the A-fragment layout
//    that dV += P^T dO and dK += dS^T Q need, so nothing goes through shared memory and no two warps
//    touch the same output rows. Likewise the dQ kernel's warps own 16 query rows.
//  - Q/dO (dK/dV kernel) or K/V (dQ kernel) stream through shared memory double-buffered with
//    cp.async; the operand that stays is loaded once. Padded rows (row stride D + 8) make every
//    ldmatrix conflict-free.
//  - Registers: for D = 64 the dK/dV warps keep their K and V fragments in registers; for D = 128
//    they re-read them from shared memory (dK + dV accumulators alone are 128 registers there).
//  - Masking only on blocks that cross the diagonal or the end of the sequence; fully masked warp
//    tiles are skipped. exp2 with a pre-multiplied scale, as in the forward.
//  - Document masking (kDoc, positions given; a separate instantiation, plain causal unchanged): key
//    s is seen only by the queries of its own document, s <= t < doc_end(s). The dK/dV kernel visits
//    the query blocks from its first key's block to the block holding the last query of its last
//    key's document (found by a binary search over the row's positions), keeps the query blocks'
//    positions in shared memory next to lse and delta, and masks t - pos[t] > s where a block holds
//    a query of a later document; the dQ kernel starts at its first query's document, as the forward.
#include <cmath>

#include "cuda/attention.h"
#include "cuda/attention_common.cuh"
#include "cuda/check.h"

namespace qtrain {
namespace attn {
namespace {

// ------------------------------------------------------------------------------------------------
// dK / dV
// ------------------------------------------------------------------------------------------------
template <int D>
struct DkvTile {
    static constexpr int kWarps = 4;
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kBc = 16 * kWarps;  // keys per CTA (16 per warp)
    static constexpr int kBr = 64;           // queries per step
    static constexpr int kS = D + 8;
    static constexpr bool kKVInRegs = D <= 64;
    // K, V (one stage) + Q, dO (two stages) as bf16; lse, delta (two stages) as fp32.
    static constexpr int kSmemBytes = (2 * kBc + 4 * kBr) * kS * 2 + 4 * kBr * 4;
    // document masking: the query blocks' positions (two stages, int32) after them
    static constexpr int kDocSmemBytes = 2 * kBr * 4;
};

template <int D, bool kDoc>
__global__ void __launch_bounds__(DkvTile<D>::kThreads)
    flash_bwd_dkdv_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                          const float* __restrict__ lse, const float* __restrict__ delta, int T, int Hq, int Hkv,
                          float scale, float scale_log2, const int32_t* __restrict__ positions) {
    using Tile = DkvTile<D>;
    constexpr int kBr = Tile::kBr, kBc = Tile::kBc, kS = Tile::kS, kThreads = Tile::kThreads;
    constexpr int kDT = D / 8, kDK = D / 16;
    constexpr int kQT = kBr / 8;  // 8-wide query tiles of S^T
    constexpr bool kKVInRegs = Tile::kKVInRegs;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sK = reinterpret_cast<bf16*>(smem_raw);  // [kBc][kS]
    bf16* sV = sK + kBc * kS;                       // [kBc][kS]
    bf16* sQ = sV + kBc * kS;                       // [2][kBr][kS]
    bf16* sdO = sQ + 2 * kBr * kS;                  // [2][kBr][kS]
    float* sL = reinterpret_cast<float*>(sdO + 2 * kBr * kS);  // [2][kBr] lse (natural log)
    float* sDel = sL + 2 * kBr;                                 // [2][kBr]
    int32_t* sPos = reinterpret_cast<int32_t*>(sDel + 2 * kBr);  // [2][kBr] (kDoc only)

    const int kb = blockIdx.x;  // key block; 0 (the most query blocks to visit) launches first
    const int kvh = blockIdx.y, b = blockIdx.z;
    const int group = Hq / Hkv;
    const int64_t ld = static_cast<int64_t>(Hq + 2 * Hkv) * D;
    const int64_t ldo = static_cast<int64_t>(Hq) * D;
    const bf16* seq = qkv + static_cast<int64_t>(b) * T * ld;
    const bf16* dseq = dout + static_cast<int64_t>(b) * T * ldo;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, c = lane & 3;
    const int k0 = kb * kBc;
    const int kw0 = k0 + warp * 16;  // first key of this warp
    const int key_lo = kw0 + g, key_hi = kw0 + g + 8;

    const int qb_first = k0 / kBr;  // first query block holding a query >= k0
    const int32_t* pos_row = kDoc ? positions + static_cast<int64_t>(b) * T : nullptr;
    // With documents, the query blocks end where the last key's document does; that binary search
    // runs after the first loads are issued (step 0 is the first query block of the first head
    // whatever the count, so 1 stands in for it until then).
    int n_per_head = kDoc ? 1 : (T + kBr - 1) / kBr - qb_first;

    // Loads of step `it` (head kvh*group + it / n_per_head, query block qb_first + it % n_per_head).
    auto load_step = [&](int it, int st) {
        const int h = kvh * group + it / n_per_head;
        const int q0 = (qb_first + it % n_per_head) * kBr;
        load_tile_async<kBr, D, kThreads>(sQ + st * kBr * kS, seq + h * D, ld, q0, T);
        load_tile_async<kBr, D, kThreads>(sdO + st * kBr * kS, dseq + h * D, ldo, q0, T);
        const int64_t row = (static_cast<int64_t>(b) * Hq + h) * T;
        for (int i = threadIdx.x; i < 2 * kBr; i += kThreads) {
            const int r = i % kBr;
            const bool valid = q0 + r < T;
            const float* src = (i < kBr ? lse : delta) + row + (valid ? q0 + r : 0);
            cp_async_4((i < kBr ? sL : sDel) + st * kBr + r, src, valid);
        }
        if constexpr (kDoc) {  // positions of the block's queries (0 past T: those queries are masked anyway)
            for (int r = threadIdx.x; r < kBr; r += kThreads) {
                const bool valid = q0 + r < T;
                cp_async_4(sPos + st * kBr + r, pos_row + (valid ? q0 + r : 0), valid);
            }
        }
    };

    load_tile_async<kBc, D, kThreads>(sK, seq + (Hq + kvh) * D, ld, k0, T);
    load_tile_async<kBc, D, kThreads>(sV, seq + (Hq + Hkv + kvh) * D, ld, k0, T);
    load_step(0, 0);
    cp_async_commit();
    if constexpr (kDoc)  // no query past the end of the last key's document sees a key of this CTA
        n_per_head = (doc_end(pos_row, min(k0 + kBc, T) - 1, T) - 1) / kBr + 1 - qb_first;
    const int n_steps = group * n_per_head;

    float dk[kDT][4], dv[kDT][4];
#pragma unroll
    for (int n = 0; n < kDT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
    uint32_t kf[kKVInRegs ? kDK : 1][4], vf[kKVInRegs ? kDK : 1][4];

    for (int it = 0; it < n_steps; ++it) {
        if (it + 1 < n_steps) {
            load_step(it + 1, (it + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if constexpr (kKVInRegs) {
            if (it == 0) {
#pragma unroll
                for (int kk = 0; kk < kDK; ++kk) {
                    ldmatrix_x4(kf[kk], a_frag_addr<kS>(sK, warp * 16, kk * 16, lane));
                    ldmatrix_x4(vf[kk], a_frag_addr<kS>(sV, warp * 16, kk * 16, lane));
                }
            }
        }
        const int st = it & 1;
        const bf16* cQ = sQ + st * kBr * kS;
        const bf16* cdO = sdO + st * kBr * kS;
        const float* cL = sL + st * kBr;
        const float* cDel = sDel + st * kBr;
        const int32_t* cPos = sPos + st * kBr;
        const int q0 = (qb_first + it % n_per_head) * kBr;
        const int q_last = min(q0 + kBr, T) - 1;  // the block's last valid query (q0 < T)

        // some (query >= key) pair with a valid query exists; with documents, the block's first query
        // (the smallest bound) does not start after this warp's last key
        if (q_last >= kw0 && (!kDoc || q0 - cPos[0] <= kw0 + 15)) {
            // S^T = K Q^T: 16 keys x kBr queries.
            float s[kQT][4];
#pragma unroll
            for (int n = 0; n < kQT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < kDK; ++kk) {
                uint32_t a[4];
                if constexpr (kKVInRegs) {
                    a[0] = kf[kk][0], a[1] = kf[kk][1], a[2] = kf[kk][2], a[3] = kf[kk][3];
                } else {
                    ldmatrix_x4(a, a_frag_addr<kS>(sK, warp * 16, kk * 16, lane));
                }
#pragma unroll
                for (int np = 0; np < kQT / 2; ++np) {
                    uint32_t bf[4];
                    ldmatrix_x4(bf, b_frag_addr_nk<kS>(cQ, np * 16, kk * 16, lane));
                    mma_16816(s[2 * np], a, bf[0], bf[1]);
                    mma_16816(s[2 * np + 1], a, bf[2], bf[3]);
                }
            }
            // P^T = exp(S^T * scale - lse[query]); zero where query < key or query >= T.
            // (with documents also where the block's last query's document starts after the warp's first key)
            const bool need_mask = q0 < kw0 + 15 || q0 + kBr > T || (kDoc && q_last - cPos[q_last - q0] > kw0);
#pragma unroll
            for (int n = 0; n < kQT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int qi = n * 8 + 2 * c + (e & 1);
                    float p = exp2f(fmaf(s[n][e], scale_log2, -cL[qi] * kLog2e));
                    if (need_mask) {
                        const int q = q0 + qi;
                        const int key = e < 2 ? key_lo : key_hi;
                        if (q < key || q >= T || (kDoc && q - cPos[qi] > key)) p = 0.0f;
                    }
                    s[n][e] = p;
                }
            // dP^T = V dO^T: 16 keys x kBr queries.
            float dp[kQT][4];
#pragma unroll
            for (int n = 0; n < kQT; ++n) dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < kDK; ++kk) {
                uint32_t a[4];
                if constexpr (kKVInRegs) {
                    a[0] = vf[kk][0], a[1] = vf[kk][1], a[2] = vf[kk][2], a[3] = vf[kk][3];
                } else {
                    ldmatrix_x4(a, a_frag_addr<kS>(sV, warp * 16, kk * 16, lane));
                }
#pragma unroll
                for (int np = 0; np < kQT / 2; ++np) {
                    uint32_t bf[4];
                    ldmatrix_x4(bf, b_frag_addr_nk<kS>(cdO, np * 16, kk * 16, lane));
                    mma_16816(dp[2 * np], a, bf[0], bf[1]);
                    mma_16816(dp[2 * np + 1], a, bf[2], bf[3]);
                }
            }
            // dV += P^T dO (reduction over the block's queries).
#pragma unroll
            for (int kq = 0; kq < kBr / 16; ++kq) {
                uint32_t pa[4];
                acc_to_a(pa, s[2 * kq], s[2 * kq + 1]);
#pragma unroll
                for (int dn = 0; dn < kDT / 2; ++dn) {
                    uint32_t bf[4];
                    ldmatrix_x4_trans(bf, b_frag_addr_kn<kS>(cdO, kq * 16, dn * 16, lane));
                    mma_16816(dv[2 * dn], pa, bf[0], bf[1]);
                    mma_16816(dv[2 * dn + 1], pa, bf[2], bf[3]);
                }
            }
            // dS^T = P^T * (dP^T - delta[query]) (the softmax scale is applied to dK at the end).
#pragma unroll
            for (int n = 0; n < kQT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int qi = n * 8 + 2 * c + (e & 1);
                    dp[n][e] = s[n][e] * (dp[n][e] - cDel[qi]);
                }
            // dK += dS^T Q.
#pragma unroll
            for (int kq = 0; kq < kBr / 16; ++kq) {
                uint32_t da[4];
                acc_to_a(da, dp[2 * kq], dp[2 * kq + 1]);
#pragma unroll
                for (int dn = 0; dn < kDT / 2; ++dn) {
                    uint32_t bf[4];
                    ldmatrix_x4_trans(bf, b_frag_addr_kn<kS>(cQ, kq * 16, dn * 16, lane));
                    mma_16816(dk[2 * dn], da, bf[0], bf[1]);
                    mma_16816(dk[2 * dn + 1], da, bf[2], bf[3]);
                }
            }
        }
        __syncthreads();  // stage `st` may be refilled next iteration
    }

    // Epilogue: stage dK and dV through this warp's own 16 rows of sK / sV (only this warp reads
    // those rows), then write whole 16-byte chunks of the rows with key < T.
    bf16* sdK = sK + warp * 16 * kS;
    bf16* sdV = sV + warp * 16 * kS;
#pragma unroll
    for (int n = 0; n < kDT; ++n) {
        const int col = n * 8 + 2 * c;
        *reinterpret_cast<uint32_t*>(sdK + g * kS + col) = pack_bf16(dk[n][0] * scale, dk[n][1] * scale);
        *reinterpret_cast<uint32_t*>(sdK + (g + 8) * kS + col) = pack_bf16(dk[n][2] * scale, dk[n][3] * scale);
        *reinterpret_cast<uint32_t*>(sdV + g * kS + col) = pack_bf16(dv[n][0], dv[n][1]);
        *reinterpret_cast<uint32_t*>(sdV + (g + 8) * kS + col) = pack_bf16(dv[n][2], dv[n][3]);
    }
    __syncwarp();
    bf16* dseq_out = dqkv + static_cast<int64_t>(b) * T * ld;
    bf16* gdk = dseq_out + (Hq + kvh) * D;
    bf16* gdv = dseq_out + (Hq + Hkv + kvh) * D;
    constexpr int kChunks = D / 8;
#pragma unroll
    for (int i = 0; i < 16 * kChunks / 32; ++i) {
        const int idx = lane + 32 * i;
        const int r = idx / kChunks, ch = idx % kChunks;
        const int t = kw0 + r;
        if (t < T) {
            *reinterpret_cast<uint4*>(gdk + t * ld + ch * 8) = *reinterpret_cast<const uint4*>(sdK + r * kS + ch * 8);
            *reinterpret_cast<uint4*>(gdv + t * ld + ch * 8) = *reinterpret_cast<const uint4*>(sdV + r * kS + ch * 8);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// dQ
// ------------------------------------------------------------------------------------------------
template <int D>
struct DqTile {
    static constexpr int kWarps = 4;
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kBr = 16 * kWarps;  // query rows per CTA
    static constexpr int kBc = 64;           // keys per step
    static constexpr int kS = D + 8;
    static constexpr bool kQInRegs = D <= 64;  // Q/dO fragments in registers (D = 128: re-read from smem)
    static constexpr int kSmemBytes = (2 * kBr + 4 * kBc) * kS * 2;  // Q, dO + 2 stages of K, V
};

template <int D, bool kDoc>
__global__ void __launch_bounds__(DqTile<D>::kThreads)
    flash_bwd_dq_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                        const float* __restrict__ lse, const float* __restrict__ delta, int T, int Hq, int Hkv,
                        float scale, float scale_log2, const int32_t* __restrict__ positions) {
    using Tile = DqTile<D>;
    constexpr int kBr = Tile::kBr, kBc = Tile::kBc, kS = Tile::kS, kThreads = Tile::kThreads;
    constexpr int kDT = D / 8, kDK = D / 16, kNT = kBc / 8;
    constexpr bool kQInRegs = Tile::kQInRegs;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [kBr][kS]
    bf16* sdO = sQ + kBr * kS;                      // [kBr][kS]
    bf16* sK = sdO + kBr * kS;                      // [2][kBc][kS]
    bf16* sV = sK + 2 * kBc * kS;                   // [2][kBc][kS]

    const int qb = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
    const int h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (Hq / Hkv);
    const int64_t ld = static_cast<int64_t>(Hq + 2 * Hkv) * D;
    const int64_t ldo = static_cast<int64_t>(Hq) * D;
    const bf16* seq = qkv + static_cast<int64_t>(b) * T * ld;
    const bf16* gk = seq + (Hq + kvh) * D;
    const bf16* gv = seq + (Hq + Hkv + kvh) * D;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, c = lane & 3;
    const int q0 = qb * kBr;
    const int wq0 = q0 + warp * 16;
    const int row_lo = wq0 + g, row_hi = wq0 + g + 8;
    const int n_kb = (min(q0 + kBr, T) - 1) / kBc + 1;
    // Document masking, as in the forward: first key block, per-row bounds, the warp's smallest and
    // largest bound.
    // (read after the Q and dO loads are issued, so the positions' latency overlaps them)
    int j0 = 0, lo_row[2] = {0, 0}, warp_lo_min = 0, warp_lo_max = 0;

    load_tile_async<kBr, D, kThreads>(sQ, seq + h * D, ld, q0, T);
    load_tile_async<kBr, D, kThreads>(sdO, dout + static_cast<int64_t>(b) * T * ldo + h * D, ldo, q0, T);
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

    // Per-row constants of this thread's two rows (0 for rows past T: their results are dropped).
    const float* glse = lse + (static_cast<int64_t>(b) * Hq + h) * T;
    const float* gdel = delta + (static_cast<int64_t>(b) * Hq + h) * T;
    const float lse2[2] = {row_lo < T ? glse[row_lo] * kLog2e : 0.0f, row_hi < T ? glse[row_hi] * kLog2e : 0.0f};
    const float del[2] = {row_lo < T ? gdel[row_lo] : 0.0f, row_hi < T ? gdel[row_hi] : 0.0f};

    float dq[kDT][4];
#pragma unroll
    for (int n = 0; n < kDT; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    uint32_t qf[kQInRegs ? kDK : 1][4], df[kQInRegs ? kDK : 1][4];

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
        if constexpr (kQInRegs) {
            if (j == j0) {
#pragma unroll
                for (int kk = 0; kk < kDK; ++kk) {
                    ldmatrix_x4(qf[kk], a_frag_addr<kS>(sQ, warp * 16, kk * 16, lane));
                    ldmatrix_x4(df[kk], a_frag_addr<kS>(sdO, warp * 16, kk * 16, lane));
                }
            }
        }
        const bf16* cK = sK + (j & 1) * kBc * kS;
        const bf16* cV = sV + (j & 1) * kBc * kS;
        const int k0 = j * kBc;

        if (wq0 < T && k0 <= wq0 + 15 && (!kDoc || k0 + kBc - 1 >= warp_lo_min)) {
            float s[kNT][4], dp[kNT][4];
#pragma unroll
            for (int n = 0; n < kNT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
            // S = Q K^T and dP = dO V^T: 16 rows x kBc keys each.
#pragma unroll
            for (int kk = 0; kk < kDK; ++kk) {
                uint32_t qa[4], da[4];
                if constexpr (kQInRegs) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) qa[i] = qf[kk][i], da[i] = df[kk][i];
                } else {
                    ldmatrix_x4(qa, a_frag_addr<kS>(sQ, warp * 16, kk * 16, lane));
                    ldmatrix_x4(da, a_frag_addr<kS>(sdO, warp * 16, kk * 16, lane));
                }
#pragma unroll
                for (int np = 0; np < kNT / 2; ++np) {
                    uint32_t bk[4], bv[4];
                    ldmatrix_x4(bk, b_frag_addr_nk<kS>(cK, np * 16, kk * 16, lane));
                    ldmatrix_x4(bv, b_frag_addr_nk<kS>(cV, np * 16, kk * 16, lane));
                    mma_16816(s[2 * np], qa, bk[0], bk[1]);
                    mma_16816(s[2 * np + 1], qa, bk[2], bk[3]);
                    mma_16816(dp[2 * np], da, bv[0], bv[1]);
                    mma_16816(dp[2 * np + 1], da, bv[2], bv[3]);
                }
            }
            // dS = P * (dP - delta), P = exp(S * scale - lse), zero where key > row.
            // (with documents also where the block starts before the warp's last row's document)
            const bool need_mask = k0 + kBc - 1 > wq0 || (kDoc && k0 < warp_lo_max);
#pragma unroll
            for (int n = 0; n < kNT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e >> 1;
                    float p = exp2f(fmaf(s[n][e], scale_log2, -lse2[r]));
                    if (need_mask) {
                        const int key = k0 + n * 8 + 2 * c + (e & 1);
                        if (key > (r ? row_hi : row_lo) || (kDoc && key < lo_row[r])) p = 0.0f;
                    }
                    dp[n][e] = p * (dp[n][e] - del[r]);
                }
            // dQ += dS K.
#pragma unroll
            for (int kk = 0; kk < kBc / 16; ++kk) {
                uint32_t da[4];
                acc_to_a(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
                for (int dn = 0; dn < kDT / 2; ++dn) {
                    uint32_t bf[4];
                    ldmatrix_x4_trans(bf, b_frag_addr_kn<kS>(cK, kk * 16, dn * 16, lane));
                    mma_16816(dq[2 * dn], da, bf[0], bf[1]);
                    mma_16816(dq[2 * dn + 1], da, bf[2], bf[3]);
                }
            }
        }
        __syncthreads();
    }

    bf16* sdQ = sQ + warp * 16 * kS;  // this warp's own rows (only this warp ever read them)
#pragma unroll
    for (int n = 0; n < kDT; ++n) {
        const int col = n * 8 + 2 * c;
        *reinterpret_cast<uint32_t*>(sdQ + g * kS + col) = pack_bf16(dq[n][0] * scale, dq[n][1] * scale);
        *reinterpret_cast<uint32_t*>(sdQ + (g + 8) * kS + col) = pack_bf16(dq[n][2] * scale, dq[n][3] * scale);
    }
    __syncwarp();
    bf16* gdq = dqkv + static_cast<int64_t>(b) * T * ld + h * D;
    constexpr int kChunks = D / 8;
#pragma unroll
    for (int i = 0; i < 16 * kChunks / 32; ++i) {
        const int idx = lane + 32 * i;
        const int r = idx / kChunks, ch = idx % kChunks;
        const int t = wq0 + r;
        if (t < T)
            *reinterpret_cast<uint4*>(gdq + t * ld + ch * 8) = *reinterpret_cast<const uint4*>(sdQ + r * kS + ch * 8);
    }
}

template <int D, bool kDoc>
void launch_bwd(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, float* delta,
                const AttentionShape& s, cudaStream_t stream, const int32_t* positions) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const float scale_log2 = scale * kLog2e;
    auto* dq = static_cast<bf16*>(dqkv);
    auto* o = static_cast<const bf16*>(out);
    auto* go = static_cast<const bf16*>(dout);
    auto* x = static_cast<const bf16*>(qkv);

    launch_attention_delta<bf16, D>(delta, go, o, s.B, s.T, s.Hq, stream);
    CUDA_CHECK(cudaGetLastError());

    {
        using Tile = DkvTile<D>;
        auto kernel = flash_bwd_dkdv_kernel<D, kDoc>;
        constexpr int smem = Tile::kSmemBytes + (kDoc ? Tile::kDocSmemBytes : 0);
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        const dim3 grid((s.T + Tile::kBc - 1) / Tile::kBc, s.Hkv, s.B);
        kernel<<<grid, Tile::kThreads, smem, stream>>>(dq, go, x, lse, delta, s.T, s.Hq, s.Hkv, scale, scale_log2,
                                                       positions);
        CUDA_CHECK(cudaGetLastError());
    }
    {
        using Tile = DqTile<D>;
        auto kernel = flash_bwd_dq_kernel<D, kDoc>;
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
        const dim3 grid((s.T + Tile::kBr - 1) / Tile::kBr, s.Hq, s.B);
        kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(dq, go, x, lse, delta, s.T, s.Hq, s.Hkv, scale,
                                                                   scale_log2, positions);
        CUDA_CHECK(cudaGetLastError());
    }
}

}  // namespace
}  // namespace attn

namespace detail {
void flash_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                              float* delta, const AttentionShape& s, cudaStream_t stream, const int32_t* positions) {
    if (positions) {
        if (s.D == 64)
            attn::launch_bwd<64, true>(dqkv, dout, qkv, out, lse, delta, s, stream, positions);
        else
            attn::launch_bwd<128, true>(dqkv, dout, qkv, out, lse, delta, s, stream, positions);
    } else if (s.D == 64) {
        attn::launch_bwd<64, false>(dqkv, dout, qkv, out, lse, delta, s, stream, nullptr);
    } else {
        attn::launch_bwd<128, false>(dqkv, dout, qkv, out, lse, delta, s, stream, nullptr);
    }
}
}  // namespace detail

}  // namespace qtrain
