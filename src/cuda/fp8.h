// FP8 building blocks: per-tensor current scaling on the device (no host sync).
//
// Convention (core/fp8_reference.h has the host emulation these kernels match bit for bit):
//   amax  = max |x| (exact; a NaN anywhere gives NaN)
//   scale = min(fmax / amax, 2^100), fmax = 448 (e4m3) / 57344 (e5m2); scale = 1 when amax is 0 or
//           not finite (inf/NaN from an overflow: values saturate to +-fmax, the scale stays finite)
//   q     = saturate_fp8(x * scale), round to nearest even
//   inv   = 1 / scale, the dequantisation factor: what cuBLASLt gets as the A/B scale pointer
//           (GemmOp::a_scale / b_scale; it multiplies the fp8 operand).
//
// amax and inv live in device memory, each float in its own 16-byte-aligned slot (kFp8ScaleSlotBytes):
// cuBLASLt 13.1 rejects scale pointers that are not 16-byte aligned (CUBLAS_STATUS_NOT_SUPPORTED).
// A producer kernel can fuse the amax (fp8_common.cuh: reduce_abs_max) instead of calling abs_max.
//
// Plain C++ (no CUDA headers beyond cudaStream_t): fp8 tensors are raw bytes (void* / uint8_t).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace qtrain::cuda {

// Every amax / inv-scale float gets its own slot of this many bytes (slot i of a scale buffer is at
// byte offset 16 * i); the launchers check the alignment of the pointers they are given.
inline constexpr std::size_t kFp8ScaleSlotBytes = 16;

// *amax = max |x| over n elements of in_type (F32 or BF16). The launcher zeroes *amax first
// (cudaMemsetAsync) unless `accumulate` is true, in which case the result is the max with the value
// already there (the max over several tensors, e.g. pieces of one gradient). Deterministic: the max
// does not depend on the order (integer atomicMax on the bit patterns).
void abs_max(float* amax, DType in_type, const void* x, int64_t n, cudaStream_t stream, bool accumulate = false);

// out[i] = fp8(in[i] * scale) with the scale computed on the device from *amax (see the top).
// out_type: E4M3 or E5M2; in_type: F32 or BF16. If inv_scale_out is not null, 1/scale is written
// there (one thread of the grid). 16-byte vector loads when `in` is 16-byte aligned and `out`
// 8-byte aligned (else a scalar path); any n.
void quantize_fp8(void* out, DType out_type, const void* in, DType in_type, int64_t n, const float* amax,
                  float* inv_scale_out, cudaStream_t stream);

// The same quantisation, transposed: in is [rows, cols] (row-major), out_t is [cols, rows]:
// out_t[c * rows + r] = fp8(in[r * cols + c] * scale). If out (row-major [rows, cols]) is not null,
// the non-transposed result is written too in the same pass (an activation used both in the forward
// GEMM and, transposed, in the weight-gradient GEMM). Shared-memory tiled (64 x 64 tiles).
// Requires rows and cols to be multiples of 16 and in/out/out_t to be 16-byte aligned (checked).
void quantize_fp8_transpose(void* out_t, DType out_type, const void* in, DType in_type, int64_t rows, int64_t cols,
                            const float* amax, float* inv_scale_out, cudaStream_t stream, void* out = nullptr);

// The SwiGLU backward and the quantisation of its result in one pass, for FP8 gradients: computes
// dgate_up = [dout * up * silu'(gate) | dout * silu(gate)] ([N, 2I], as swiglu_backward does, rounded
// to in_type) from dout [N, I] and gate_up [N, 2I], and writes it quantised with `amax` (which
// swiglu_backward with a null output has taken over the same values) as out [N, 2I] and transposed
// as out_t [2I, N], without the bf16 copy ever reaching memory. Equals swiglu_backward followed by
// quantize_fp8_transpose(dgate_up) bit for bit. N and I multiples of 16, pointers 16-byte aligned.
void swiglu_backward_quantize_transpose(void* out_t, void* out, DType out_type, const void* dout, const void* gate_up,
                                        DType in_type, int64_t N, int64_t I, const float* amax, float* inv_scale_out,
                                        cudaStream_t stream);

// out_t = in^T for an fp8 matrix already quantised (bytes moved as they are): in is [rows, cols],
// out_t [cols, rows]. transpose_fp8(quantize_fp8(x)) equals quantize_fp8_transpose(x) bit for bit
// (the scale is per tensor), which is how streamed persistent FP8 weights (--persistent-quants) get
// their transposed copy on the device instead of crossing PCIe twice. Same requirements as above.
void transpose_fp8(void* out_t, const void* in, int64_t rows, int64_t cols, cudaStream_t stream);

// ZeRO-3's FP8 weights (model/cuda/weights.h): `rank_amax` holds `ranks` rows of `count` floats, row
// r = rank r's abs-max over its part of each tensor (0 where it owns none). For each tensor i, the
// max over the rows goes to amax slot i and 1/scale of it (the rule of quantize_fp8, for fp8_type)
// to inv_scale slot i, where slot i of a base is the 16-byte slot (i / group) * group_stride + i % group
// (amax and inv_scale each with their own stride: the model's scale slots interleave per layer).
// Bit for bit the amax abs_max takes over the whole tensor (a max of maxes is exact).
struct Fp8SlotMap {
    int group = 1, amax_group_stride = 1, inv_group_stride = 1;
};
void max_over_ranks_fp8_scales(float* amax_slots, float* inv_scale_slots, const float* rank_amax, int count, int ranks,
                               Fp8SlotMap map, DType fp8_type, cudaStream_t stream);

}  // namespace qtrain::cuda
