// fp32 causal GQA attention (forward and backward) on CUDA cores: the --model-dtype=fp32 debugging
// path, compared tightly (~1e-5) with the CPU reference, so it favours plain fp32 arithmetic over speed.
//
// Why it is shaped this way:
//  - Same algorithm and blocking as the flash kernels (online softmax, lse saved, backward split into
//    a dK/dV kernel that owns each key and a dQ kernel that owns each query row: deterministic, no
//    atomics), but one score per LANE instead of per MMA fragment: a warp scores 32 keys (or 32
//    queries) at once against one row, reduces max/sum with shuffles, then switches to one output
//    dimension per lane (d = lane + 32 i) to accumulate P V, P^T dO, dS^T Q or dS K, broadcasting
//    each probability with a shuffle.
//  - K/V (or Q/dO) tiles live in shared memory with rows padded to D + 1 floats where a lane walks
//    its own row (conflict-free), unpadded where a warp reads one row across lanes.
//  - Nothing here needs to be fast: CTAs are small (4 warps), tiles are reloaded per step with plain
//    loads and no pipelining.
//  - Document masking (positions non-null): a row's keys start at doc_start(t) (attention_common.cuh),
//    bound 0 without positions, so the same code is the plain causal one then; the key (forward, dQ)
//    or query (dK/dV) tiles outside the documents are not visited.
#include <cmath>

#include "cuda/attention.h"
#include "cuda/attention_common.cuh"
#include "cuda/check.h"

namespace qtrain {
namespace attn {
namespace {

constexpr int kWarps32 = 4;
constexpr int kThreads32 = kWarps32 * 32;

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
    return x;
}

// Dot product of two D-float rows in shared memory, fixed order.
template <int D>
__device__ __forceinline__ float row_dot(const float* a, const float* b) {
    float s = 0.0f;
#pragma unroll 16
    for (int d = 0; d < D; ++d) s = fmaf(a[d], b[d], s);
    return s;
}

// Copies kRows rows of D floats (token t0 + r at g + t * ld) into smem rows of stride kStride; rows
// past T become zeros.
template <int kRows, int D, int kStride>
__device__ __forceinline__ void load_rows(float* s, const float* g, int64_t ld, int t0, int T) {
    for (int i = threadIdx.x; i < kRows * D; i += kThreads32) {
        const int r = i / D, d = i % D;
        const int t = t0 + r;
        s[r * kStride + d] = t < T ? g[static_cast<int64_t>(t) * ld + d] : 0.0f;
    }
}

// ---- forward: CTA = (16 query rows, head, batch row); warp = 4 rows; lane = one key of a 32-key tile.
constexpr int kFwdQ = 16, kFwdK = 32, kRowsPerWarp = kFwdQ / kWarps32;

template <int D>
constexpr int fwd32_smem_bytes() {
    return (kFwdQ * D + kFwdK * (D + 1) + kFwdK * D) * 4;
}

template <int D>
__global__ void __launch_bounds__(kThreads32)
    fp32_fwd_kernel(float* __restrict__ out, float* __restrict__ lse, const float* __restrict__ qkv, int T, int Hq,
                    int Hkv, float scale_log2, const int32_t* __restrict__ positions) {
    constexpr int kPer = D / 32;
    extern __shared__ float smem32[];
    float* sQ = smem32;                  // [kFwdQ][D]
    float* sK = sQ + kFwdQ * D;          // [kFwdK][D + 1]: lane j walks row j
    float* sV = sK + kFwdK * (D + 1);    // [kFwdK][D]: lanes read across a row

    const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
    const int h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (Hq / Hkv);
    const int64_t ld = static_cast<int64_t>(Hq + 2 * Hkv) * D;
    const float* seq = qkv + static_cast<int64_t>(b) * T * ld;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int q0 = qt * kFwdQ;
    const int n_kt = (min(q0 + kFwdQ, T) - 1) / kFwdK + 1;
    const int32_t* pos_row = positions ? positions + static_cast<int64_t>(b) * T : nullptr;
    const int kt0 = pos_row ? doc_start(pos_row, q0) / kFwdK : 0;  // earlier keys: other documents

    load_rows<kFwdQ, D, D>(sQ, seq + h * D, ld, q0, T);

    float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kPer];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < kPer; ++i) o[r][i] = 0.0f;
    }

    for (int kt = kt0; kt < n_kt; ++kt) {
        __syncthreads();  // previous tile fully consumed
        load_rows<kFwdK, D, D + 1>(sK, seq + (Hq + kvh) * D, ld, kt * kFwdK, T);
        load_rows<kFwdK, D, D>(sV, seq + (Hq + Hkv + kvh) * D, ld, kt * kFwdK, T);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
            const int row = q0 + warp * kRowsPerWarp + r;
            if (row >= T || kt * kFwdK > row) continue;  // warp-uniform
            const int lo = pos_row ? doc_start(pos_row, row) : 0;  // the row's first visible key
            if (kt * kFwdK + kFwdK - 1 < lo) continue;            // warp-uniform: another document
            const int key = kt * kFwdK + lane;
            const bool valid = key <= row && key >= lo;
            const float s = valid ? row_dot<D>(sQ + (warp * kRowsPerWarp + r) * D, sK + lane * (D + 1)) * scale_log2
                                  : -INFINITY;
            // The tile meets [lo, row], so it holds a visible key and the tile max is finite.
            const float m_new = fmaxf(m[r], warp_max(s));
            const float alpha = exp2f(m[r] - m_new);
            const float p = valid ? exp2f(s - m_new) : 0.0f;
            l[r] = l[r] * alpha + warp_sum(p);
            m[r] = m_new;
#pragma unroll
            for (int i = 0; i < kPer; ++i) o[r][i] *= alpha;
            for (int j = 0; j < 32; ++j) {
                const float pj = __shfl_sync(kFullMask, p, j);
#pragma unroll
                for (int i = 0; i < kPer; ++i) o[r][i] = fmaf(pj, sV[j * D + lane + 32 * i], o[r][i]);
            }
        }
    }

    const int64_t ldo = static_cast<int64_t>(Hq) * D;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
        const int row = q0 + warp * kRowsPerWarp + r;
        if (row >= T) continue;
        float* orow = out + (static_cast<int64_t>(b) * T + row) * ldo + h * D;
        const float inv = 1.0f / l[r];
#pragma unroll
        for (int i = 0; i < kPer; ++i) orow[lane + 32 * i] = o[r][i] * inv;
        if (lane == 0) lse[(static_cast<int64_t>(b) * Hq + h) * T + row] = (m[r] + log2f(l[r])) * kLn2;
    }
}

// ---- dK/dV: CTA = (16 keys, kv head, batch row); warp = 4 keys; lane = one query of a 32-query tile.
constexpr int kDkvK = 16, kDkvQ = 32, kKeysPerWarp = kDkvK / kWarps32;

template <int D>
constexpr int dkv32_smem_bytes() {
    return (2 * kDkvK * D + 2 * kDkvQ * (D + 1) + 3 * kDkvQ) * 4;
}

template <int D>
__global__ void __launch_bounds__(kThreads32)
    fp32_dkdv_kernel(float* __restrict__ dqkv, const float* __restrict__ dout, const float* __restrict__ qkv,
                     const float* __restrict__ lse, const float* __restrict__ delta, int T, int Hq, int Hkv,
                     float scale, float scale_log2, const int32_t* __restrict__ positions) {
    constexpr int kPer = D / 32;
    extern __shared__ float smem32[];
    float* sK = smem32;                      // [kDkvK][D]
    float* sV = sK + kDkvK * D;              // [kDkvK][D]
    float* sQ = sV + kDkvK * D;              // [kDkvQ][D + 1]: lane j walks row j
    float* sdO = sQ + kDkvQ * (D + 1);       // [kDkvQ][D + 1]
    float* sL = sdO + kDkvQ * (D + 1);       // [kDkvQ] lse * log2(e)
    float* sDel = sL + kDkvQ;                // [kDkvQ]
    int* sLo = reinterpret_cast<int*>(sDel + kDkvQ);  // [kDkvQ] each query's first visible key (0: causal)

    const int k0 = blockIdx.x * kDkvK;
    const int kvh = blockIdx.y, b = blockIdx.z;
    const int group = Hq / Hkv;
    const int64_t ld = static_cast<int64_t>(Hq + 2 * Hkv) * D;
    const int64_t ldo = static_cast<int64_t>(Hq) * D;
    const float* seq = qkv + static_cast<int64_t>(b) * T * ld;
    const float* dseq = dout + static_cast<int64_t>(b) * T * ldo;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    load_rows<kDkvK, D, D>(sK, seq + (Hq + kvh) * D, ld, k0, T);
    load_rows<kDkvK, D, D>(sV, seq + (Hq + Hkv + kvh) * D, ld, k0, T);

    float dk[kKeysPerWarp][kPer], dv[kKeysPerWarp][kPer];
#pragma unroll
    for (int r = 0; r < kKeysPerWarp; ++r)
#pragma unroll
        for (int i = 0; i < kPer; ++i) dk[r][i] = dv[r][i] = 0.0f;

    const int32_t* pos_row = positions ? positions + static_cast<int64_t>(b) * T : nullptr;
    // no query past the end of the last key's document sees a key of this CTA
    const int q_end = pos_row ? doc_end(pos_row, min(k0 + kDkvK, T) - 1, T) : T;
    const int n_qt = (q_end + kDkvQ - 1) / kDkvQ;
    for (int hh = 0; hh < group; ++hh) {
        const int h = kvh * group + hh;
        const float* glse = lse + (static_cast<int64_t>(b) * Hq + h) * T;
        const float* gdel = delta + (static_cast<int64_t>(b) * Hq + h) * T;
        for (int qt = k0 / kDkvQ; qt < n_qt; ++qt) {
            const int q0 = qt * kDkvQ;
            __syncthreads();  // previous tile fully consumed (and K/V loaded, first time)
            load_rows<kDkvQ, D, D + 1>(sQ, seq + h * D, ld, q0, T);
            load_rows<kDkvQ, D, D + 1>(sdO, dseq + h * D, ldo, q0, T);
            if (threadIdx.x < kDkvQ) {
                const int t = q0 + threadIdx.x;
                sL[threadIdx.x] = t < T ? glse[t] * kLog2e : 0.0f;
                sDel[threadIdx.x] = t < T ? gdel[t] : 0.0f;
                sLo[threadIdx.x] = pos_row && t < T ? doc_start(pos_row, t) : 0;
            }
            __syncthreads();
#pragma unroll
            for (int r = 0; r < kKeysPerWarp; ++r) {
                const int kr = warp * kKeysPerWarp + r;  // key row in the tile
                const int key = k0 + kr;
                if (key >= T || q0 + kDkvQ - 1 < key) continue;  // warp-uniform: no query sees this key
                const int q = q0 + lane;
                const bool valid = q >= key && q < T && sLo[lane] <= key;
                float p = 0.0f, ds = 0.0f;
                if (valid) {
                    const float s = row_dot<D>(sQ + lane * (D + 1), sK + kr * D);
                    const float dp = row_dot<D>(sdO + lane * (D + 1), sV + kr * D);
                    p = exp2f(fmaf(s, scale_log2, -sL[lane]));
                    ds = p * (dp - sDel[lane]);
                }
                for (int j = 0; j < 32; ++j) {
                    const float pj = __shfl_sync(kFullMask, p, j);
                    const float dsj = __shfl_sync(kFullMask, ds, j);
#pragma unroll
                    for (int i = 0; i < kPer; ++i) {
                        dv[r][i] = fmaf(pj, sdO[j * (D + 1) + lane + 32 * i], dv[r][i]);
                        dk[r][i] = fmaf(dsj, sQ[j * (D + 1) + lane + 32 * i], dk[r][i]);
                    }
                }
            }
        }
    }

    float* dseq_out = dqkv + static_cast<int64_t>(b) * T * ld;
#pragma unroll
    for (int r = 0; r < kKeysPerWarp; ++r) {
        const int key = k0 + warp * kKeysPerWarp + r;
        if (key >= T) continue;
        float* gdk = dseq_out + static_cast<int64_t>(key) * ld + (Hq + kvh) * D;
        float* gdv = dseq_out + static_cast<int64_t>(key) * ld + (Hq + Hkv + kvh) * D;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
            gdk[lane + 32 * i] = dk[r][i] * scale;
            gdv[lane + 32 * i] = dv[r][i];
        }
    }
}

// ---- dQ: CTA = (16 query rows, head, batch row); warp = 4 rows; lane = one key of a 32-key tile.
constexpr int kDqQ = 16, kDqK = 32, kDqRowsPerWarp = kDqQ / kWarps32;

template <int D>
constexpr int dq32_smem_bytes() {
    return (2 * kDqQ * D + 2 * kDqK * (D + 1)) * 4;
}

template <int D>
__global__ void __launch_bounds__(kThreads32)
    fp32_dq_kernel(float* __restrict__ dqkv, const float* __restrict__ dout, const float* __restrict__ qkv,
                   const float* __restrict__ lse, const float* __restrict__ delta, int T, int Hq, int Hkv,
                   float scale, float scale_log2, const int32_t* __restrict__ positions) {
    constexpr int kPer = D / 32;
    extern __shared__ float smem32[];
    float* sQ = smem32;                 // [kDqQ][D]
    float* sdO = sQ + kDqQ * D;         // [kDqQ][D]
    float* sK = sdO + kDqQ * D;         // [kDqK][D + 1]: lane j walks row j, and lanes read across rows
    float* sV = sK + kDqK * (D + 1);    // [kDqK][D + 1]

    const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
    const int h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (Hq / Hkv);
    const int64_t ld = static_cast<int64_t>(Hq + 2 * Hkv) * D;
    const int64_t ldo = static_cast<int64_t>(Hq) * D;
    const float* seq = qkv + static_cast<int64_t>(b) * T * ld;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int q0 = qt * kDqQ;
    const int n_kt = (min(q0 + kDqQ, T) - 1) / kDqK + 1;
    const int32_t* pos_row = positions ? positions + static_cast<int64_t>(b) * T : nullptr;
    const int kt0 = pos_row ? doc_start(pos_row, q0) / kDqK : 0;

    load_rows<kDqQ, D, D>(sQ, seq + h * D, ld, q0, T);
    load_rows<kDqQ, D, D>(sdO, dout + static_cast<int64_t>(b) * T * ldo + h * D, ldo, q0, T);

    const float* glse = lse + (static_cast<int64_t>(b) * Hq + h) * T;
    const float* gdel = delta + (static_cast<int64_t>(b) * Hq + h) * T;
    float lse2[kDqRowsPerWarp], del[kDqRowsPerWarp], dq[kDqRowsPerWarp][kPer];
    int lo[kDqRowsPerWarp];  // each row's first visible key (0: causal)
#pragma unroll
    for (int r = 0; r < kDqRowsPerWarp; ++r) {
        const int row = q0 + warp * kDqRowsPerWarp + r;
        lse2[r] = row < T ? glse[row] * kLog2e : 0.0f;
        del[r] = row < T ? gdel[row] : 0.0f;
        lo[r] = pos_row && row < T ? doc_start(pos_row, row) : 0;
#pragma unroll
        for (int i = 0; i < kPer; ++i) dq[r][i] = 0.0f;
    }

    for (int kt = kt0; kt < n_kt; ++kt) {
        __syncthreads();
        load_rows<kDqK, D, D + 1>(sK, seq + (Hq + kvh) * D, ld, kt * kDqK, T);
        load_rows<kDqK, D, D + 1>(sV, seq + (Hq + Hkv + kvh) * D, ld, kt * kDqK, T);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < kDqRowsPerWarp; ++r) {
            const int rr = warp * kDqRowsPerWarp + r;
            const int row = q0 + rr;
            if (row >= T || kt * kDqK > row || kt * kDqK + kDqK - 1 < lo[r]) continue;  // warp-uniform
            const int key = kt * kDqK + lane;
            float ds = 0.0f;
            if (key <= row && key >= lo[r]) {
                const float s = row_dot<D>(sQ + rr * D, sK + lane * (D + 1));
                const float dp = row_dot<D>(sdO + rr * D, sV + lane * (D + 1));
                const float p = exp2f(fmaf(s, scale_log2, -lse2[r]));
                ds = p * (dp - del[r]);
            }
            for (int j = 0; j < 32; ++j) {
                const float dsj = __shfl_sync(kFullMask, ds, j);
#pragma unroll
                for (int i = 0; i < kPer; ++i) dq[r][i] = fmaf(dsj, sK[j * (D + 1) + lane + 32 * i], dq[r][i]);
            }
        }
    }

#pragma unroll
    for (int r = 0; r < kDqRowsPerWarp; ++r) {
        const int row = q0 + warp * kDqRowsPerWarp + r;
        if (row >= T) continue;
        float* gdq = dqkv + (static_cast<int64_t>(b) * T + row) * ld + h * D;
#pragma unroll
        for (int i = 0; i < kPer; ++i) gdq[lane + 32 * i] = dq[r][i] * scale;
    }
}

template <int D>
void launch_fwd32(float* out, float* lse, const float* qkv, const AttentionShape& s, cudaStream_t stream,
                  const int32_t* positions) {
    constexpr int smem = fwd32_smem_bytes<D>();
    CUDA_CHECK(cudaFuncSetAttribute(fp32_fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid((s.T + kFwdQ - 1) / kFwdQ, s.Hq, s.B);
    const float scale_log2 = (1.0f / std::sqrt(static_cast<float>(D))) * kLog2e;
    fp32_fwd_kernel<D><<<grid, kThreads32, smem, stream>>>(out, lse, qkv, s.T, s.Hq, s.Hkv, scale_log2, positions);
    CUDA_CHECK(cudaGetLastError());
}

template <int D>
void launch_bwd32(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                  float* delta, const AttentionShape& s, cudaStream_t stream, const int32_t* positions) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const float scale_log2 = scale * kLog2e;
    launch_attention_delta<float, D>(delta, dout, out, s.B, s.T, s.Hq, stream);
    CUDA_CHECK(cudaGetLastError());
    {
        constexpr int smem = dkv32_smem_bytes<D>();
        CUDA_CHECK(cudaFuncSetAttribute(fp32_dkdv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        const dim3 grid((s.T + kDkvK - 1) / kDkvK, s.Hkv, s.B);
        fp32_dkdv_kernel<D><<<grid, kThreads32, smem, stream>>>(dqkv, dout, qkv, lse, delta, s.T, s.Hq, s.Hkv,
                                                                scale, scale_log2, positions);
        CUDA_CHECK(cudaGetLastError());
    }
    {
        constexpr int smem = dq32_smem_bytes<D>();
        CUDA_CHECK(cudaFuncSetAttribute(fp32_dq_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        const dim3 grid((s.T + kDqQ - 1) / kDqQ, s.Hq, s.B);
        fp32_dq_kernel<D><<<grid, kThreads32, smem, stream>>>(dqkv, dout, qkv, lse, delta, s.T, s.Hq, s.Hkv, scale,
                                                              scale_log2, positions);
        CUDA_CHECK(cudaGetLastError());
    }
}

}  // namespace
}  // namespace attn

namespace detail {
void fp32_attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& s,
                            cudaStream_t stream, const int32_t* positions) {
    if (s.D == 64)
        attn::launch_fwd32<64>(out, lse, qkv, s, stream, positions);
    else
        attn::launch_fwd32<128>(out, lse, qkv, s, stream, positions);
}
void fp32_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             float* delta, const AttentionShape& s, cudaStream_t stream, const int32_t* positions) {
    if (s.D == 64)
        attn::launch_bwd32<64>(dqkv, dout, qkv, out, lse, delta, s, stream, positions);
    else
        attn::launch_bwd32<128>(dqkv, dout, qkv, out, lse, delta, s, stream, positions);
}
}  // namespace detail

}  // namespace qtrain
