#include "model/cpu/cpu_head_norm.h"

#include <cmath>
#include <vector>

namespace qtrain::cpu {

void head_rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows, int D,
                          float eps) {
#pragma omp parallel for schedule(static) if (rows * D > (1 << 16))
    for (int64_t r = 0; r < rows; ++r) {
        const float* x = inp + r * D;
        double ss = 0.0;
        for (int i = 0; i < D; ++i) ss += static_cast<double>(x[i]) * x[i];
        const float s = 1.0f / std::sqrt(static_cast<float>(ss / D) + eps);
        rstd[r] = s;
        float* o = out + r * D;
        for (int i = 0; i < D; ++i) o[i] = weight[i] * (x[i] * s);
    }
}

void head_rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                           const float* rstd, int64_t rows, int D) {
    // y = w * x * s with s = (mean(x^2) + eps)^-1/2: dx = s * (w*dy) - x * s^3 * sum(w*dy*x) / D,
    // dw += dy * x * s. The weight gradient is summed in row order (deterministic).
    std::vector<double> dw(static_cast<size_t>(D), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
        const float *x = inp + r * D, *dy = dout + r * D;
        const float s = rstd[r];
        double dot = 0.0;
        for (int i = 0; i < D; ++i) {
            dot += static_cast<double>(weight[i]) * dy[i] * x[i];
            dw[i] += static_cast<double>(dy[i]) * x[i] * s;
        }
        const float k = static_cast<float>(dot / D) * s * s * s;
        float* dx = dinp + r * D;
        for (int i = 0; i < D; ++i) dx[i] = s * (weight[i] * dy[i]) - x[i] * k;
    }
    for (int i = 0; i < D; ++i) dweight[i] += static_cast<float>(dw[i]);
}

}  // namespace qtrain::cpu
