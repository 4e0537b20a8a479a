// Host emulation of the FP8 path (per-tensor current scaling), bit for bit what the GPU kernels of
// src/cuda/fp8_quantize.cu produce, so they and the cuBLASLt FP8 GEMMs have a reference:
//
//   amax  = max |x|, taken on the float bit patterns (|x| as an unsigned integer: the same order as
//           the float order for non-negative values; a NaN sorts above +inf, so a NaN anywhere gives
//           a NaN amax). Exact, so GPU and CPU agree regardless of the reduction order.
//   scale = fmax / amax (round to nearest), fmax = 448 (e4m3) or 57344 (e5m2), clamped to at most
//           kFp8MaxScale = 2^100 (a subnormal amax would make it inf; tensors with amax below
//           fmax * 2^-100, ~3e-28 for e4m3, are therefore not scaled all the way up); scale = 1 when amax is 0 (all-zero tensor) or not finite (an overflow upstream:
//           the values then saturate to +-fmax, NaNs stay NaN, and the training loop's non-finite
//           check sees the problem; the scale itself stays finite).
//   q     = saturate_fp8(x * scale), round to nearest even (float_to_e4m3 / float_to_e5m2 of
//           core/dtype.h, which match __nv_cvt_float_to_fp8(..., __NV_SATFINITE, ...)).
//   inv   = 1 / scale (round to nearest): the dequantisation factor, x ~= inv * q. This is what
//           cuBLASLt gets as the A/B scale pointer (it multiplies the fp8 operand).
//
// Why the clamp is 2^100: the GPU flushes fp32 subnormals to zero (-use_fast_math); with scale <= 2^100
// a subnormal input (< 2^-126) times the scale is below 2^-26, which rounds to (signed) zero in both
// fp8 formats (smallest codes 2^-9 and 2^-16) whether or not it was flushed first, so GPU and host
// agree. scale and inv = 1/scale (>= 2^-100) are always normal floats.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace qtrain {

inline constexpr float kFp8MaxScale = 0x1p100f;

struct Fp8Scale {
    float scale = 1.0f;  // multiplies x before the conversion to fp8
    float inv = 1.0f;    // 1 / scale: the dequantisation factor (cuBLASLt's A/B scale)
};

// 448 for E4M3, 57344 for E5M2; throws for any other dtype.
float fp8_max(DType fp8_type);
// The largest |x| as described above (0 for n == 0).
float fp8_abs_max(const float* x, int64_t n);
// The scale rule above.
Fp8Scale fp8_scale_from_amax(float amax, DType fp8_type);
// One value: saturating, round-to-nearest-even encode of x * scale.
uint8_t fp8_quantize_value(float x, float scale, DType fp8_type);
float fp8_decode(uint8_t q, DType fp8_type);

// out[i] = fp8(in[i] * scale); returns nothing else (the caller has the scale).
void fp8_quantize(uint8_t* out, DType fp8_type, const float* in, int64_t n, float scale);
// out[c * rows + r] = fp8(in[r * cols + c] * scale): in is [rows, cols], out is [cols, rows].
void fp8_quantize_transpose(uint8_t* out, DType fp8_type, const float* in, int64_t rows, int64_t cols, float scale);
// out[i] = inv * decode(q[i])
void fp8_dequantize(float* out, const uint8_t* q, DType fp8_type, int64_t n, float inv);

// amax, scale and quantisation in one call (what abs_max + quantize_fp8 do on the GPU).
struct Fp8Tensor {
    std::vector<uint8_t> q;
    float amax = 0.0f;
    Fp8Scale scale;
};
Fp8Tensor fp8_quantize_tensor(const std::vector<float>& x, DType fp8_type);

// The product every FP8 GEMM helper computes, with both operands K-major (the TN layout):
//   out[i, j] = a_inv * b_inv * sum_k decode(a[i, k]) * decode(b[j, k]) (+ bias[j]) (+ beta * out[i, j])
// a is [M, K], b is [N, K], out is [M, N], all row-major; bias (length N) may be null; beta is 0
// (overwrite) or 1 (accumulate). The fp8 products are exact and summed in double, so this is the
// exact result up to one final rounding to float.
//   forward:      y[N,out]  = xq[N,in]    . wq[out,in]^T    (a = xq,   b = wq)
//   input grad:   dx[N,in]  = dyq[N,out]  . wTq[in,out]^T   (a = dyq,  b = wTq)
//   weight grad:  dW[out,in] += dyTq[out,N] . xTq[in,N]^T   (a = dyTq, b = xTq)
void fp8_gemm_reference(float* out, const uint8_t* a, DType a_type, float a_inv, const uint8_t* b, DType b_type,
                        float b_inv, const float* bias, int64_t M, int64_t N, int64_t K, float beta = 0.0f);

}  // namespace qtrain
