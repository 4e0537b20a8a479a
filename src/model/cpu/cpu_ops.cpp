// Row-wise and elementwise reference ops (embedding, RMSNorm, residual, SwiGLU, RoPE) and AdamW.
// Each follows HF Qwen2's fp32 arithmetic order where it matters for rounding, so the GPU kernels can
// be compared against these at tight tolerances.
#include "model/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/cpu/cpu_parallel.h"

namespace qtrain::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* table, int N, int C) {
#pragma omp parallel for schedule(static) if (int64_t{N} * C > kMinParallelWork)
    for (int n = 0; n < N; ++n)
        std::memcpy(out + static_cast<int64_t>(n) * C, table + static_cast<int64_t>(tokens[n]) * C, sizeof(float) * C);
}

void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int N, int C, int32_t skip_token) {
    // Sequential: two positions may hold the same token, and the sum must not depend on threads.
    for (int n = 0; n < N; ++n) {
        if (tokens[n] == skip_token) continue;
        float* d = dtable + static_cast<int64_t>(tokens[n]) * C;
        const float* g = dout + static_cast<int64_t>(n) * C;
        for (int c = 0; c < C; ++c) d[c] += g[c];
    }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
#pragma omp parallel for schedule(static) if (int64_t{N} * C > kMinParallelWork)
    for (int n = 0; n < N; ++n) {
        const float* x = inp + static_cast<int64_t>(n) * C;
        float* o = out + static_cast<int64_t>(n) * C;
        float ss = 0.0f;
        for (int c = 0; c < C; ++c) ss += x[c] * x[c];
        const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
        // HF multiplies by rstd first, then by the weight.
        for (int c = 0; c < C; ++c) o[c] = weight[c] * (x[c] * r);
        rstd[n] = r;
    }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
    // y = w * xhat, xhat = x * r  =>  dx = r * (dy*w - xhat * mean(dy*w*xhat)).
#pragma omp parallel for schedule(static) if (int64_t{N} * C > kMinParallelWork)
    for (int n = 0; n < N; ++n) {
        const float* x = inp + static_cast<int64_t>(n) * C;
        const float* dy = dout + static_cast<int64_t>(n) * C;
        float* dx = dinp + static_cast<int64_t>(n) * C;
        const float r = rstd[n];
        float dot = 0.0f;
        for (int c = 0; c < C; ++c) dot += dy[c] * weight[c] * (x[c] * r);
        const float mean = dot / static_cast<float>(C);
        for (int c = 0; c < C; ++c) dx[c] += r * (dy[c] * weight[c] - x[c] * r * mean);
    }
    if (!dweight) return;
    // Rows in order: the weight gradient is a sum over all rows.
    for (int n = 0; n < N; ++n) {
        const float* x = inp + static_cast<int64_t>(n) * C;
        const float* dy = dout + static_cast<int64_t>(n) * C;
        const float r = rstd[n];
        for (int c = 0; c < C; ++c) dweight[c] += dy[c] * (x[c] * r);
    }
}

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kMinParallelWork)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kMinParallelWork / 16)
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        const float silu = g / (1.0f + std::exp(-g));
        out[i] = silu * up[i];
    }
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kMinParallelWork / 16)
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        const float s = 1.0f / (1.0f + std::exp(-g));
        // d silu / dg = s + g * s * (1 - s)
        dgate[i] += dout[i] * up[i] * (s * (1.0f + g * (1.0f - s)));
        dup[i] += dout[i] * (g * s);
    }
}

// HF's default RoPE frequencies: 1.0 / (base ** (arange(0, D, 2).float() / D)), in float32.
static std::vector<float> default_inv_freq(int D, double theta) {
    std::vector<float> inv_freq(D / 2);
    for (int i = 0; i < D / 2; ++i) {
        const float exponent = static_cast<float>(2 * i) / static_cast<float>(D);
        inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta), exponent);
    }
    return inv_freq;
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
    std::vector<float> inv_freq = default_inv_freq(c.head_dim, c.rope_theta);
    if (c.rope_type != "llama3") return inv_freq;
    // transformers' _compute_llama3_parameters, op for op in float32 (python scalars meet float32
    // tensors as float32): wavelengths above the original context's / low_freq_factor are divided
    // by factor, those below / high_freq_factor kept, the band between blended smoothly.
    const double old_len = c.rope_original_max_position_embeddings;
    const float low_wavelen = static_cast<float>(old_len / c.rope_low_freq_factor);
    const float high_wavelen = static_cast<float>(old_len / c.rope_high_freq_factor);
    const float factor = static_cast<float>(c.rope_factor), low = static_cast<float>(c.rope_low_freq_factor);
    const float span = static_cast<float>(c.rope_high_freq_factor - c.rope_low_freq_factor);
    const float two_pi = static_cast<float>(2.0 * 3.14159265358979323846);
    for (float& f : inv_freq) {
        const float wavelen = two_pi / f;
        const float scaled = wavelen > low_wavelen ? f / factor : f;
        const float smooth = (static_cast<float>(old_len) / wavelen - low) / span;
        const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        f = medium ? smoothed : scaled;
    }
    return inv_freq;
}

static void rope_tables_from(float* cos, float* sin, int T, const std::vector<float>& inv_freq) {
    const int half = static_cast<int>(inv_freq.size());
    for (int t = 0; t < T; ++t) {
        for (int i = 0; i < half; ++i) {
            const float angle = static_cast<float>(t) * inv_freq[i];
            cos[static_cast<int64_t>(t) * half + i] = std::cos(angle);
            sin[static_cast<int64_t>(t) * half + i] = std::sin(angle);
        }
    }
}

void rope_tables(float* cos, float* sin, int T, int D, double theta) {
    rope_tables_from(cos, sin, T, default_inv_freq(D, theta));
}

void rope_tables(float* cos, float* sin, int T, const ModelConfig& cfg) {
    rope_tables_from(cos, sin, T, rope_inv_freq(cfg));
}

// Rotates each (i, i + D/2) pair by +angle (forward) or -angle (backward: the transpose of a rotation).
static void rope_rotate(float* out, const float* inp, const float* cos, const float* sin, int B, int T, int H, int D,
                        float direction, const int32_t* positions) {
    const int half = D / 2;
#pragma omp parallel for collapse(2) schedule(static) if (int64_t{B} * T * H * D > kMinParallelWork)
    for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T; ++t) {
            const int64_t p = positions ? positions[static_cast<int64_t>(b) * T + t] : t;
            const float* cs = cos + p * half;
            const float* sn = sin + p * half;
            for (int h = 0; h < H; ++h) {
                const int64_t base = ((static_cast<int64_t>(b) * T + t) * H + h) * D;
                const float* x = inp + base;
                float* o = out + base;
                for (int i = 0; i < half; ++i) {
                    const float x1 = x[i], x2 = x[i + half];
                    const float s = direction * sn[i];
                    // HF: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1).
                    o[i] = x1 * cs[i] - x2 * s;
                    o[i + half] = x2 * cs[i] + x1 * s;
                }
            }
        }
    }
}

void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int B, int T, int H, int D,
                  const int32_t* positions) {
    rope_rotate(out, inp, cos, sin, B, T, H, D, 1.0f, positions);
}

void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int B, int T, int H, int D,
                   const int32_t* positions) {
    rope_rotate(dinp, dout, cos, sin, B, T, H, D, -1.0f, positions);
}

double sum_squares(const float* x, int64_t n) {
    constexpr int64_t kBlock = 1 << 16;
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t end = std::min(n, (b + 1) * kBlock);
        double s = 0.0;
        for (int64_t i = b * kBlock; i < end; ++i) s += static_cast<double>(x[i]) * x[i];
        partial[b] = s;
    }
    double total = 0.0;
    for (double p : partial) total += p;
    return total;
}

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int step) {
    const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), step));
    const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), step));
#pragma omp parallel for schedule(static) if (n > kMinParallelWork / 8)
    for (int64_t i = 0; i < n; ++i) {
        const float g = grad[i] * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float m_hat = mi / bc1;
        const float v_hat = vi / bc2;
        param[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * param[i]);
    }
}

}  // namespace qtrain::cpu
