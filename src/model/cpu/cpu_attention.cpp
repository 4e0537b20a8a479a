// Causal grouped-query attention, fp32. Shaped like flash attention rather than like a textbook:
// the forward saves only the log-sum-exp of each softmax row and the backward recomputes the
// probabilities from it. That keeps memory at O(T) per head instead of O(T^2) (seq_len 1024+ stays
// cheap), and the forward and backward use bit-identical probabilities exp(score - lse), which is
// also what the GPU kernels will be compared on.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "model/cpu/cpu_ops.h"
#include "model/cpu/cpu_parallel.h"

namespace qtrain::cpu {

static inline float dot(const float* a, const float* b, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; ++d) s += a[d] * b[d];
    return s;
}

// The first key query t of row b sees: its document's first token, or 0 without document masking.
static inline int first_key(const int32_t* positions, int b, int T, int t) {
    return positions ? t - positions[static_cast<int64_t>(b) * T + t] : 0;
}

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int B, int T, int Hq,
                       int Hkv, int D, const int32_t* positions) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const int group = Hq / Hkv;
    const int64_t rows = static_cast<int64_t>(B) * Hq * T;
    const bool parallel = rows * T * D / 2 > kMinParallelWork;
#pragma omp parallel if (parallel)
    {
        std::vector<float> score(static_cast<size_t>(T));
        // Row t costs O(t): dynamic scheduling balances the triangle; each row is still one thread's.
#pragma omp for schedule(dynamic, 16)
        for (int64_t row = 0; row < rows; ++row) {
            const int t = static_cast<int>(row % T);
            const int h = static_cast<int>((row / T) % Hq);
            const int b = static_cast<int>(row / (static_cast<int64_t>(T) * Hq));
            const int kvh = h / group;
            const int s0 = first_key(positions, b, T, t);
            const float* qt = q + ((static_cast<int64_t>(b) * T + t) * Hq + h) * D;
            float mx = -std::numeric_limits<float>::infinity();
            for (int s = s0; s <= t; ++s) {
                const float* ks = k + ((static_cast<int64_t>(b) * T + s) * Hkv + kvh) * D;
                score[s] = dot(qt, ks, D) * scale;
                mx = std::max(mx, score[s]);
            }
            float sum = 0.0f;
            for (int s = s0; s <= t; ++s) sum += std::exp(score[s] - mx);
            const float l = mx + std::log(sum);
            float* o = out + ((static_cast<int64_t>(b) * T + t) * Hq + h) * D;
            for (int d = 0; d < D; ++d) o[d] = 0.0f;
            for (int s = s0; s <= t; ++s) {
                const float p = std::exp(score[s] - l);
                const float* vs = v + ((static_cast<int64_t>(b) * T + s) * Hkv + kvh) * D;
                for (int d = 0; d < D; ++d) o[d] += p * vs[d];
            }
            lse[(static_cast<int64_t>(b) * Hq + h) * T + t] = l;
        }
    }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* lse, int B, int T, int Hq, int Hkv, int D,
                        const int32_t* positions) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const int group = Hq / Hkv;
    // One task per (batch row, kv head): it owns dk/dv of that kv head and dq of the query heads that
    // share it, so no two threads write the same output.
    const bool parallel = static_cast<int64_t>(B) * Hq * T * T * D > kMinParallelWork;
#pragma omp parallel if (parallel)
    {
        std::vector<float> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T));
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; ++b) {
            for (int kvh = 0; kvh < Hkv; ++kvh) {
                for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
                    for (int t = 0; t < T; ++t) {
                        const int64_t qi = ((static_cast<int64_t>(b) * T + t) * Hq + h) * D;
                        const float* qt = q + qi;
                        const float* go = dout + qi;
                        const float l = lse[(static_cast<int64_t>(b) * Hq + h) * T + t];
                        const int s0 = first_key(positions, b, T, t);
                        float pdp = 0.0f;  // sum_s p_s * dp_s = d(loss)/d(out) . out
                        for (int s = s0; s <= t; ++s) {
                            const int64_t ki = ((static_cast<int64_t>(b) * T + s) * Hkv + kvh) * D;
                            p[s] = std::exp(dot(qt, k + ki, D) * scale - l);
                            dp[s] = dot(go, v + ki, D);
                            pdp += p[s] * dp[s];
                        }
                        float* gq = dq + qi;
                        for (int s = s0; s <= t; ++s) {
                            const int64_t ki = ((static_cast<int64_t>(b) * T + s) * Hkv + kvh) * D;
                            const float ds = p[s] * (dp[s] - pdp) * scale;  // d(loss)/d(raw q.k)
                            const float* ks = k + ki;
                            float* gk = dk + ki;
                            float* gv = dv + ki;
                            for (int d = 0; d < D; ++d) {
                                gq[d] += ds * ks[d];
                                gk[d] += ds * qt[d];
                                gv[d] += p[s] * go[d];
                            }
                        }
                    }
                }
            }
        }
    }
}

}  // namespace qtrain::cpu
