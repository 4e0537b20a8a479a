// LoRA's two products of one target's output gradient dy in one read of it (perf-notes session 26,
// "lever 6"): g = s dy B (the adapter's rank-r input gradient) and dB += s dy^T u (B's gradient).
// Two cuBLASLt GEMMs read the whole dy slice each (gate's at 7B: 931 MB a layer, ~0.22 ms at the
// HBM rate); here every block streams a 64-token x 256-column tile of dy through shared memory once
// and feeds it to the tensor cores twice: as the A operand of g (row-major) and, transposed, as the A
// operand of dB (col-major). Both products have rank r <= 32 columns, so their accumulators are few:
//  - a block owns a 256-column strip of dy and every S-th 64-token tile of it (S token strips);
//  - g's 64 x r tile is complete over the strip's 256 columns only: each strip writes its partial sum
//    (fp32, [K strips][N][R]), and a second kernel adds the K partials in a fixed order;
//  - dB's 256 x r block stays in registers across the block's tiles and is written once per token
//    strip ([S][out][R]), then added likewise.
// The partials cost 4 R (1/256 + S/N) of dy's bytes (12.5% + a little at R = 16): the fused pass reads
// dy once plus those, against twice. Deterministic (no atomics): fixed tiles, fixed summation order.
#include <mma.h>

#include <algorithm>

#include "cuda/attention_common.cuh"
#include "cuda/check.h"
#include "cuda/fp8_common.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/kernels.h"
#include "cuda/tile_window.cuh"

namespace qtrain::cuda {

namespace {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

constexpr int kTokens = 64;             // a tile's rows (4 warps x 16)
constexpr int kCols = 256;              // a block's strip of dy's columns (4 warps x 64 for dB)
constexpr int kLd = kCols + 8;          // dy tile row stride in shared memory (bank-conflict padding)
constexpr int kThreads = 128;

template <int R>
constexpr int kLdR = R + 8;  // u / B tiles' row stride in shared memory

template <int R>
constexpr std::size_t smem_bytes() {
    return sizeof(bf16) * (2 * kTokens * kLd + 2 * kTokens * kLdR<R> + kCols * kLdR<R>);
}

// grid (K column strips, S token strips); see the file comment. kCodes: 0, or dy's FP8 codes too
// (1: e4m3, 2: e5m2), encoded from the tile in shared memory as quantize_fp8 encodes them.
template <int R, int kCodes>
__global__ void __launch_bounds__(kThreads) lora_dy_grads_kernel(const bf16* __restrict__ dy, int64_t ldy,
                                                                 const bf16* __restrict__ B,
                                                                 const bf16* __restrict__ u, int64_t ldu,
                                                                 int64_t N, int64_t out, int r,
                                                                 float* __restrict__ g_part, int64_t n_pad,
                                                                 float* __restrict__ db_part, int64_t out_pad,
                                                                 uint8_t* __restrict__ codes, int64_t ldc,
                                                                 const float* amax, float* inv_out) {
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* dys = reinterpret_cast<bf16*>(smem);  // [2][kTokens][kLd]
    bf16* us = dys + 2 * kTokens * kLd;         // [2][kTokens][ld_r]
    bf16* bs = us + 2 * kTokens * kLdR<R>;    // [kCols][ld_r]
    const int tid = threadIdx.x, warp = tid / 32;
    const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kCols;
    const int strip = blockIdx.y, strips = gridDim.y;
    const int64_t tiles = (N + kTokens - 1) / kTokens;
    const int mine = strip < tiles ? static_cast<int>((tiles - strip + strips - 1) / strips) : 0;
    float code_scale = 0.0f;
    if constexpr (kCodes != 0) code_scale = block_scale<kCodes == 1>(amax, inv_out);

    // B's rows of this strip (zero past out and past r: they add nothing)
    for (int i = tid; i < kCols * R; i += kThreads) {
        const int row = i / R, j = i % R;
        const int64_t o = c0 + row;
        bs[row * kLdR<R> + j] = o < out && j < r ? B[o * r + j] : __float2bfloat16(0.0f);
    }
    // tile t of dy (and u's rows of it) into buffer `buf`, asynchronously; zeros past N, out and r
    auto load = [&](int64_t t, int buf) {
        load_window_async<kTokens, kCols, kLd, kThreads>(dys + buf * kTokens * kLd, dy, ldy, N, out, t * kTokens, c0);
        load_window_async<kTokens, R, kLdR<R>, kThreads>(us + buf * kTokens * kLdR<R>, u, ldu, N, r, t * kTokens, 0);
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> db_acc[4][R / 16];  // this warp's 64 columns x R
    for (int cf = 0; cf < 4; ++cf)
        for (int jj = 0; jj < R / 16; ++jj) wmma::fill_fragment(db_acc[cf][jj], 0.0f);

    if (mine > 0) load(strip, 0);
    attn::cp_async_commit();
    for (int i = 0; i < mine; ++i) {
        const int64_t t = strip + static_cast<int64_t>(i) * strips;
        const int buf = i & 1;
        if (i + 1 < mine) load(t + strips, buf ^ 1);  // (buffer buf^1 was freed by the last iteration's sync)
        attn::cp_async_commit();
        attn::cp_async_wait<1>();  // this tile's group has landed (the next one may be in flight)
        __syncthreads();           // ... for every thread's copies, and B's rows
        const bf16* d = dys + buf * kTokens * kLd;
        const bf16* uu = us + buf * kTokens * kLdR<R>;

        if constexpr (kCodes != 0)  // the tile's codes
            store_window_codes<kTokens, kCols, kLd, kThreads, kCodes == 1>(d, codes, ldc, N, out, t * kTokens, c0,
                                                                           code_scale);

        // g: this warp's 16 rows of the tile against the strip's 256 rows of B
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> g_acc[R / 16];
        for (int jj = 0; jj < R / 16; ++jj) wmma::fill_fragment(g_acc[jj], 0.0f);
#pragma unroll 4
        for (int kk = 0; kk < kCols; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
            wmma::load_matrix_sync(a, d + warp * 16 * kLd + kk, kLd);
#pragma unroll
            for (int jj = 0; jj < R / 16; ++jj) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
                wmma::load_matrix_sync(b, bs + kk * kLdR<R> + jj * 16, kLdR<R>);
                wmma::mma_sync(g_acc[jj], a, b, g_acc[jj]);
            }
        }
        float* gp = g_part + (static_cast<int64_t>(blockIdx.x) * n_pad + t * kTokens + warp * 16) * R;
#pragma unroll
        for (int jj = 0; jj < R / 16; ++jj) wmma::store_matrix_sync(gp + jj * 16, g_acc[jj], R, wmma::mem_row_major);

        // dB: this warp's 64 columns of the tile, transposed (dy^T is dy read col-major), against u
#pragma unroll
        for (int kk = 0; kk < kTokens; kk += 16) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> ub[R / 16];
#pragma unroll
            for (int jj = 0; jj < R / 16; ++jj) wmma::load_matrix_sync(ub[jj], uu + kk * kLdR<R> + jj * 16, kLdR<R>);
#pragma unroll
            for (int cf = 0; cf < 4; ++cf) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> at;
                wmma::load_matrix_sync(at, d + kk * kLd + warp * 64 + cf * 16, kLd);
#pragma unroll
                for (int jj = 0; jj < R / 16; ++jj) wmma::mma_sync(db_acc[cf][jj], at, ub[jj], db_acc[cf][jj]);
            }
        }
        __syncthreads();  // every warp is done with buffer buf before the next iteration loads into it
    }
    float* dp = db_part + (static_cast<int64_t>(strip) * out_pad + c0 + warp * 64) * R;
#pragma unroll
    for (int cf = 0; cf < 4; ++cf)
#pragma unroll
        for (int jj = 0; jj < R / 16; ++jj)
            wmma::store_matrix_sync(dp + cf * 16 * R + jj * 16, db_acc[cf][jj], R, wmma::mem_row_major);
}

// The strips' partial sums of a product ([strips][strip_rows][R] fp32), added in strip order:
// store(row, j, s * sum) for every row < rows and j < r.
template <class Store>
__global__ void lora_dy_grads_sum(Store store, const float* part, int64_t strip_rows, int strips, int R, int64_t rows,
                                  int r, float s) {
    const int64_t n_all = rows * r;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_all;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = i / r;
        const int j = static_cast<int>(i % r);
        float acc = 0.0f;
        for (int k = 0; k < strips; ++k) acc += part[(k * strip_rows + row) * R + j];
        store(row, j, s * acc);
    }
}
struct StoreG {  // g[n, j] =, rounded once to bf16
    bf16* g;
    int64_t ldg;
    __device__ void operator()(int64_t n, int j, float v) const { g[n * ldg + j] = __float2bfloat16_rn(v); }
};
struct AddToDb {  // dB[o, j] += (fp32)
    float* dB;
    int r;
    __device__ void operator()(int64_t o, int j, float v) const { dB[o * r + j] += v; }
};

int padded_rank(int r) { return r <= 16 ? 16 : 32; }

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 65535)); }

template <int R, int kCodes>
void launch_products(const LoraDyGradsPlan& p, float* g_part, float* db_part, const void* dy, int64_t ldy,
                     const void* B, const void* u, int64_t ldu, const Fp8CodesOut* codes, cudaStream_t s) {
    constexpr std::size_t smem = smem_bytes<R>();
    auto kernel = lora_dy_grads_kernel<R, kCodes>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<dim3(p.col_strips, p.token_strips), kThreads, smem, s>>>(
        static_cast<const bf16*>(dy), ldy, static_cast<const bf16*>(B), static_cast<const bf16*>(u), ldu, p.N, p.out,
        p.r, g_part, p.n_pad, db_part, p.out_pad, codes ? static_cast<uint8_t*>(codes->codes) : nullptr,
        codes ? codes->ldc : 0, codes ? codes->amax : nullptr, codes ? codes->inv_out : nullptr);
    CUDA_CHECK(cudaGetLastError());
}

template <int R>
void launch(const LoraDyGradsPlan& p, void* g, int64_t ldg, float* dB, const void* dy, int64_t ldy, const void* B,
            const void* u, int64_t ldu, float scale, void* workspace, cudaStream_t s, const Fp8CodesOut* codes) {
    float* g_part = static_cast<float*>(workspace);
    float* db_part = g_part + static_cast<int64_t>(p.col_strips) * p.n_pad * R;
    if (!codes)
        launch_products<R, 0>(p, g_part, db_part, dy, ldy, B, u, ldu, codes, s);
    else if (codes->type == DType::E4M3)
        launch_products<R, 1>(p, g_part, db_part, dy, ldy, B, u, ldu, codes, s);
    else
        launch_products<R, 2>(p, g_part, db_part, dy, ldy, B, u, ldu, codes, s);
    lora_dy_grads_sum<<<grid_for(p.N * p.r), 256, 0, s>>>(StoreG{static_cast<bf16*>(g), ldg}, g_part, p.n_pad,
                                                         p.col_strips, R, p.N, p.r, scale);
    CUDA_CHECK(cudaGetLastError());
    lora_dy_grads_sum<<<grid_for(p.out * p.r), 256, 0, s>>>(AddToDb{dB, p.r}, db_part, p.out_pad, p.token_strips, R,
                                                           p.out, p.r, scale);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool lora_dy_grads_supported(DType act, const void* dy, int64_t ldy, const void* u, int64_t ldu, int64_t out, int r) {
    auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return act == DType::BF16 && r > 0 && r <= 32 && r % 8 == 0 && out > 0 && out % 8 == 0 && ldy % 8 == 0 &&
           ldu % 8 == 0 && aligned16(dy) && aligned16(u);
}

LoraDyGradsPlan plan_lora_dy_grads(int64_t N, int64_t out, int r, int sm_count) {
    LoraDyGradsPlan p;
    p.N = N, p.out = out, p.r = r;
    const int R = padded_rank(r);
    const int64_t tiles = ceil_div(N, static_cast<int64_t>(kTokens));
    p.col_strips = static_cast<int>(ceil_div(out, static_cast<int64_t>(kCols)));
    // one wave: two blocks an SM fit (86-98 KB of shared memory each), and a second wave of a few
    // blocks would double the time; no token strip without a tile
    const int64_t slots = 2 * static_cast<int64_t>(std::clamp(sm_count, 1, kLoraDyGradsMaxSms));
    p.token_strips = static_cast<int>(std::clamp<int64_t>(slots / p.col_strips, 1, std::max<int64_t>(tiles, 1)));
    p.n_pad = tiles * kTokens;
    p.out_pad = p.col_strips * static_cast<int64_t>(kCols);
    p.workspace_bytes = sizeof(float) * static_cast<std::size_t>(R) *
                        static_cast<std::size_t>(p.col_strips * p.n_pad + p.token_strips * p.out_pad);
    return p;
}

std::size_t lora_dy_grads_workspace_bound(int64_t N, int64_t out, int r) {
    // (the workspace grows with the token strips, which grow with the SM count)
    return plan_lora_dy_grads(N, out, r, kLoraDyGradsMaxSms).workspace_bytes;
}

bool fp8_codes_out_supported(const Fp8CodesOut& c) {
    return c.codes != nullptr && reinterpret_cast<uintptr_t>(c.codes) % 8 == 0 && c.ldc % 8 == 0 && c.amax != nullptr &&
           (c.type == DType::E4M3 || c.type == DType::E5M2);
}

void lora_dy_grads(const LoraDyGradsPlan& p, void* g, int64_t ldg, float* dB, const void* dy, int64_t ldy,
                   const void* B, const void* u, int64_t ldu, float scale, void* workspace, cudaStream_t s,
                   const Fp8CodesOut* codes) {
    QT_CHECK(!codes || fp8_codes_out_supported(*codes),
             "lora_dy_grads: FP8 codes need an 8-byte aligned buffer, a row stride that is a multiple of 8, an amax "
             "and an FP8 type");
    if (p.N == 0 || p.out == 0) return;
    if (padded_rank(p.r) == 16)
        launch<16>(p, g, ldg, dB, dy, ldy, B, u, ldu, scale, workspace, s, codes);
    else
        launch<32>(p, g, ldg, dB, dy, ldy, B, u, ldu, scale, workspace, s, codes);
}

}  // namespace qtrain::cuda
