// LoRA's u = x A^T and x's FP8 codes in one read of x (perf-notes session 27, "lever 8"). On the frozen
// FP8 base every matrix input x is read twice in bf16 besides the base GEMM's codes: by quantize_fp8,
// which writes those codes, and by the adapters' u GEMM. Here each block owns 64 rows of x and walks
// their columns in 128-wide chunks through shared memory (cp.async, double-buffered, with the same
// chunk of the stacked A's): each chunk is encoded to FP8 (quantize_fp8's helpers, so the same bytes)
// and multiplied into the block's 64 x W of u on the tensor cores (WMMA bf16, fp32 accumulators, which
// stay in registers: a block sums all of `in` itself, so no partial sums and no workspace). u is
// rounded once to bf16 through shared memory at the end.
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

constexpr int kRows = 64;        // a block's rows of x (4 warps x 16)
constexpr int kChunk = 128;      // columns of x (and of A) a step brings in
constexpr int kLd = kChunk + 8;  // their row stride in shared memory (bank-conflict padding; 272 bytes)
constexpr int kThreads = 128;

template <int W16>
constexpr std::size_t smem_bytes() {
    return sizeof(bf16) * 2 * (kRows + W16) * kLd;  // x and A chunks, double-buffered
}

// W16: W rounded up to 16 (A's rows past W read as zeros; u's columns past W are not stored).
// kE4M3: the codes' format.
template <int W16, bool kE4M3>
__global__ void __launch_bounds__(kThreads) lora_u_codes_kernel(bf16* __restrict__ u, int64_t ldu,
                                                                const bf16* __restrict__ x, int64_t N, int64_t in,
                                                                const bf16* __restrict__ A, int W,
                                                                uint8_t* __restrict__ codes, int64_t ldc,
                                                                const float* amax, float* inv_out) {
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* xs = reinterpret_cast<bf16*>(smem);  // [2][kRows][kLd]
    bf16* as = xs + 2 * kRows * kLd;           // [2][W16][kLd]
    const int tid = threadIdx.x, warp = tid / 32;
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRows;
    const int chunks = static_cast<int>((in + kChunk - 1) / kChunk);
    const float scale = block_scale<kE4M3>(amax, inv_out);

    // chunk k of x's rows and of A into buffer `buf`, asynchronously; zeros past N, in and W
    auto load = [&](int k, int buf) {
        const int64_t c0 = static_cast<int64_t>(k) * kChunk;
        load_window_async<kRows, kChunk, kLd, kThreads>(xs + buf * kRows * kLd, x, in, N, in, n0, c0);
        load_window_async<W16, kChunk, kLd, kThreads>(as + buf * W16 * kLd, A, in, W, in, 0, c0);
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[W16 / 16];  // u: this warp's 16 rows x W16
#pragma unroll
    for (int jj = 0; jj < W16 / 16; ++jj) wmma::fill_fragment(acc[jj], 0.0f);

    load(0, 0);
    attn::cp_async_commit();
    for (int k = 0; k < chunks; ++k) {
        const int buf = k & 1;
        if (k + 1 < chunks) load(k + 1, buf ^ 1);  // (buffer buf^1 was freed by the last iteration's sync)
        attn::cp_async_commit();
        attn::cp_async_wait<1>();
        __syncthreads();
        const bf16* xd = xs + buf * kRows * kLd;
        const bf16* ad = as + buf * W16 * kLd;
        const int64_t c0 = static_cast<int64_t>(k) * kChunk;

        store_window_codes<kRows, kChunk, kLd, kThreads, kE4M3>(xd, codes, ldc, N, in, n0, c0, scale);  // x's codes
        // u += x_chunk A_chunk^T: A's rows read col-major are A^T's columns
#pragma unroll
        for (int kk = 0; kk < kChunk; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
            wmma::load_matrix_sync(a, xd + warp * 16 * kLd + kk, kLd);
#pragma unroll
            for (int jj = 0; jj < W16 / 16; ++jj) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
                wmma::load_matrix_sync(b, ad + jj * 16 * kLd + kk, kLd);
                wmma::mma_sync(acc[jj], a, b, acc[jj]);
            }
        }
        __syncthreads();  // every warp is done with buffer buf before the next iteration loads into it
    }
    // u through shared memory (the x buffers are free: the last iteration synced), rounded once to bf16
    float* stage = reinterpret_cast<float*>(smem);  // [kRows][W16]
#pragma unroll
    for (int jj = 0; jj < W16 / 16; ++jj)
        wmma::store_matrix_sync(stage + warp * 16 * W16 + jj * 16, acc[jj], W16, wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < kRows * W; i += kThreads) {
        const int row = i / W, j = i % W;
        const int64_t n = n0 + row;
        if (n < N) u[n * ldu + j] = __float2bfloat16_rn(stage[row * W16 + j]);
    }
}

template <int W16, bool kE4M3>
void launch(void* u, int64_t ldu, const void* x, int64_t N, int64_t in, const void* A, int W, const Fp8CodesOut& c,
            cudaStream_t s) {
    constexpr std::size_t smem = smem_bytes<W16>();
    static_assert(kRows * W16 * sizeof(float) <= sizeof(bf16) * 2 * kRows * kLd, "u's staging fits the x buffers");
    auto kernel = lora_u_codes_kernel<W16, kE4M3>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<static_cast<unsigned>(ceil_div(N, kRows)), kThreads, smem, s>>>(
        static_cast<bf16*>(u), ldu, static_cast<const bf16*>(x), N, in, static_cast<const bf16*>(A), W,
        static_cast<uint8_t*>(c.codes), c.ldc, c.amax, c.inv_out);
    CUDA_CHECK(cudaGetLastError());
}

template <int W16>
void launch_format(void* u, int64_t ldu, const void* x, int64_t N, int64_t in, const void* A, int W,
                   const Fp8CodesOut& c, cudaStream_t s) {
    if (c.type == DType::E4M3) launch<W16, true>(u, ldu, x, N, in, A, W, c, s);
    else launch<W16, false>(u, ldu, x, N, in, A, W, c, s);
}

int padded_width(int W) {
    for (int w : {16, 32, 48, 64, 96})
        if (W <= w) return w;
    return 0;
}

}  // namespace

bool lora_u_codes_supported(DType act, const void* x, int64_t in, const void* A, int W, const Fp8CodesOut& codes) {
    auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return act == DType::BF16 && in > 0 && in % 8 == 0 && W > 0 && W % 8 == 0 && padded_width(W) > 0 &&
           aligned16(x) && aligned16(A) && fp8_codes_out_supported(codes) && codes.ldc == in;
}

void lora_u_codes(void* u, int64_t ldu, const void* x, int64_t N, int64_t in, const void* A, int W,
                  const Fp8CodesOut& codes, cudaStream_t s) {
    QT_CHECK(lora_u_codes_supported(DType::BF16, x, in, A, W, codes),
             "lora_u_codes: unsupported call (in = ", in, ", W = ", W, "; see lora_u_codes_supported)");
    if (N == 0) return;
    switch (padded_width(W)) {
        case 16: return launch_format<16>(u, ldu, x, N, in, A, W, codes, s);
        case 32: return launch_format<32>(u, ldu, x, N, in, A, W, codes, s);
        case 48: return launch_format<48>(u, ldu, x, N, in, A, W, codes, s);
        case 64: return launch_format<64>(u, ldu, x, N, in, A, W, codes, s);
        default: return launch_format<96>(u, ldu, x, N, in, A, W, codes, s);
    }
}

}  // namespace qtrain::cuda
