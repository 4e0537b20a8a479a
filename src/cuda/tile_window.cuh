// Shared-memory tiles of a row-major bf16 matrix for the fused LoRA kernels (lora_dy_grads.cu,
// lora_u_codes.cu): the async load of a kRows x kCols window at (r0, c0), and the FP8 codes of a window
// already in shared memory, written where the window came from. Both move 16-byte vectors of 8 values,
// so the matrix's column count, its row stride and c0 are multiples of 8 and a vector lies wholly inside
// or outside the matrix. (attention_common.cuh's load_tile_async bounds rows only, over whole rows.)
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/attention_common.cuh"
#include "cuda/fp8_common.cuh"
#include "cuda/kernel_utils.cuh"

namespace qtrain::cuda {

// window rows r0.. and columns c0.. of g ([rows, cols], row stride ld) into smem (row stride kLd),
// asynchronously (cp.async: the caller commits and waits); zeros past rows and cols
template <int kRows, int kCols, int kLd, int kThreads>
__device__ __forceinline__ void load_window_async(__nv_bfloat16* smem, const __nv_bfloat16* g, int64_t ld,
                                                  int64_t rows, int64_t cols, int64_t r0, int64_t c0) {
    for (int v = threadIdx.x; v < kRows * kCols / 8; v += kThreads) {
        const int row = v / (kCols / 8), cv = v % (kCols / 8);
        const int64_t r = r0 + row, c = c0 + cv * 8;
        const bool ok = r < rows && c < cols;
        attn::cp_async_16(smem + row * kLd + cv * 8, ok ? g + r * ld + c : g, ok);
    }
}

// the window in smem (as load_window_async left it) times `scale` as FP8 codes (quantize_fp8's
// encoding: the same bytes) into codes ([rows, cols], row stride ldc) at (r0, c0); 8-byte stores
template <int kRows, int kCols, int kLd, int kThreads, bool kE4M3>
__device__ __forceinline__ void store_window_codes(const __nv_bfloat16* smem, uint8_t* codes, int64_t ldc,
                                                   int64_t rows, int64_t cols, int64_t r0, int64_t c0, float scale) {
    for (int v = threadIdx.x; v < kRows * kCols / 8; v += kThreads) {
        const int row = v / (kCols / 8), cv = v % (kCols / 8);
        const int64_t r = r0 + row, c = c0 + cv * 8;
        if (r >= rows || c >= cols) continue;
        Pack<__nv_bfloat16> p;
        p.load(smem + row * kLd + cv * 8);
        uint32_t words[2];
        encode_pack<kE4M3, 8>(words, p.v, scale);
        store_words<8>(codes + r * ldc + c, words);
    }
}

}  // namespace qtrain::cuda
