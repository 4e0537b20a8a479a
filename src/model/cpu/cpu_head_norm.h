// Per-head RMSNorm (Qwen3's q_norm / k_norm): each row of D values (one head of one token) is
// normalised with one weight vector [D] shared by all heads. fp32 reference ops.
#pragma once

#include <cstdint>

namespace qtrain::cpu {

// out = weight * inp * rstd, rstd[r] = 1 / sqrt(mean(inp[r]^2) + eps), for rows r = 0..rows-1.
// out may alias inp.
void head_rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows, int D,
                          float eps);
// dinp = d(loss)/d(inp) from dout (written; may alias dout); dweight [D] accumulated (+=).
void head_rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                           const float* rstd, int64_t rows, int D);

}  // namespace qtrain::cpu
