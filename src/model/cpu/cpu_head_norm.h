// Per-head RMSNorm (Qwen3's q_norm / k_norm): HF's RMSNorm applied to every head vector of q and k
// over its last dimension D, with one weight [D] shared by all heads. Same raw-pointer style and
// conventions as cpu_ops.h; the reference of cuda::qk_norm_rope_forward / _backward (which fuse it
// with RoPE on the GPU).
#pragma once

#include <cstdint>

namespace qtrain::cpu {

// Per row of D contiguous values (rows = tokens x heads, e.g. q [B, T, H, D] is B*T*H rows):
// out = weight * (x * rstd), rstd = 1/sqrt(mean(x^2) + eps), in fp32 in HF's order; rstd[rows] saved
// for the backward. out may alias inp.
void head_rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows, int D,
                          float eps);
// dinp = d(out)/d(inp) applied to dout, WRITTEN (not +=; may alias dout);
// dweight[D] += sum over rows of dout * inp * rstd (accumulated in double in row order, added once;
// may be null). Deterministic at any thread count.
void head_rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                           const float* rstd, int64_t rows, int D);

}  // namespace qtrain::cpu
