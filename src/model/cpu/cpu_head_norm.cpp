// Per-head RMSNorm reference (Qwen3 q_norm / k_norm). The row statistics follow HF's fp32 order
// (sum of squares in float, rsqrt, x * rstd, then * weight), as cpu_ops.cpp's rmsnorm does; the
// weight gradient sums many rows (tokens x heads), so it is accumulated in double and added once.
#include "model/cpu/cpu_head_norm.h"

#include <cmath>
#include <vector>

#include "model/cpu/cpu_parallel.h"

namespace qtrain::cpu {

void head_rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows, int D,
                          float eps) {
#pragma omp parallel for schedule(static) if (rows * D > kMinParallelWork)
    for (int64_t n = 0; n < rows; ++n) {
        const float* x = inp + n * D;
        float* o = out + n * D;
        float ss = 0.0f;
        for (int c = 0; c < D; ++c) ss += x[c] * x[c];
        const float r = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
        for (int c = 0; c < D; ++c) o[c] = weight[c] * (x[c] * r);  // o[c] only after x[c]: in place is fine
        rstd[n] = r;
    }
}

void head_rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                           const float* rstd, int64_t rows, int D) {
    // The weight gradient first: dinp may alias dout, which it reads.
    if (dweight) {
        std::vector<double> acc(static_cast<size_t>(D), 0.0);
        for (int64_t n = 0; n < rows; ++n) {  // rows in order
            const float* x = inp + n * D;
            const float* dy = dout + n * D;
            const float r = rstd[n];
            for (int c = 0; c < D; ++c) acc[c] += static_cast<double>(dy[c]) * (x[c] * r);
        }
        for (int c = 0; c < D; ++c) dweight[c] += static_cast<float>(acc[c]);
    }
    // y = w * xhat, xhat = x * r  =>  dx = r * (dy*w - xhat * mean(dy*w*xhat)).
#pragma omp parallel for schedule(static) if (rows * D > kMinParallelWork)
    for (int64_t n = 0; n < rows; ++n) {
        const float* x = inp + n * D;
        const float* dy = dout + n * D;
        float* dx = dinp + n * D;
        const float r = rstd[n];
        float dot = 0.0f;
        for (int c = 0; c < D; ++c) dot += dy[c] * weight[c] * (x[c] * r);
        const float mean = dot / static_cast<float>(D);
        for (int c = 0; c < D; ++c) dx[c] = r * (dy[c] * weight[c] - x[c] * r * mean);  // after dy[c]: in place ok
    }
}

}  // namespace qtrain::cpu
