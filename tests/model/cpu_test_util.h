// Helpers shared by the CPU reference model tests: tiny configs, random batches, finite differences
// (random_vector and the generic helpers are in tests/test_util.h).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/cpu/cpu_model.h"
#include "model/model_config.h"
#include "test_util.h"  // random_vector, TempDir, ...

namespace qtrain::test {

// Small enough for finite differences on every tensor; vocab 37 is a multiple of nothing useful, so
// chunking and blocking edge cases show up.
inline ModelConfig tiny_config(bool tied) {
    ModelConfig c;
    c.vocab_size = 37;
    c.hidden_size = 16;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 4;
    c.intermediate_size = 24;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-6;
    c.tie_word_embeddings = tied;
    c.initializer_range = 0.02;
    c.max_position_embeddings = 128;
    return c;
}

// Qwen3's block (q/k norm, no biases) with head_dim 6 != hidden / heads = 4.
inline ModelConfig tiny_qwen3_config(bool tied) {
    ModelConfig c = tiny_config(tied);
    c.architecture = "Qwen3ForCausalLM";
    c.model_type = "qwen3";
    c.head_dim = 6;
    c.qkv_bias = false;
    c.qk_norm = true;
    return c;
}

// Llama's block (no biases) with llama3 RoPE: with head_dim 6 and theta 10000 the wavelengths are
// 6.3, 135 and 2922 positions; original_max_position_embeddings 16, low 1, high 4 blends the first
// (between 4 and 16) and divides the other two by the factor.
inline ModelConfig tiny_llama_config(bool tied) {
    ModelConfig c = tiny_config(tied);
    c.architecture = "LlamaForCausalLM";
    c.model_type = "llama";
    c.head_dim = 6;
    c.qkv_bias = false;
    c.rms_norm_eps = 1e-5;
    c.rope_type = "llama3";
    c.rope_factor = 8.0;
    c.rope_low_freq_factor = 1.0;
    c.rope_high_freq_factor = 4.0;
    c.rope_original_max_position_embeddings = 16;
    return c;
}

// A micro-batch that owns its tokens.
struct TokenBatch {
    int B = 0, T = 0;
    std::vector<int32_t> inputs, targets;
    Batch view() const { return Batch{inputs.data(), targets.data(), B, T}; }
};

// Random tokens; targets are the next input (the last one random), with every `mask_every`-th
// target masked (-1) when mask_every > 0.
inline TokenBatch random_batch(int B, int T, int vocab, uint64_t seed, int mask_every = 0) {
    Rng rng(seed);
    TokenBatch b{B, T, std::vector<int32_t>(static_cast<size_t>(B) * T),
                 std::vector<int32_t>(static_cast<size_t>(B) * T)};
    for (auto& t : b.inputs) t = static_cast<int32_t>(rng.below(vocab));
    for (int r = 0; r < B; ++r)
        for (int t = 0; t < T; ++t) {
            const size_t i = static_cast<size_t>(r) * T + t;
            b.targets[i] = t + 1 < T ? b.inputs[i + 1] : static_cast<int32_t>(rng.below(vocab));
            if (mask_every > 0 && i % mask_every == 1) b.targets[i] = -1;
        }
    return b;
}

// Central difference of f at x[i] with step h (x[i] restored afterwards).
inline double central_difference(const std::function<double()>& f, float* x, double h) {
    const float saved = *x;
    *x = static_cast<float>(saved + h);
    const double up = f();
    const double h_up = static_cast<double>(*x) - saved;  // the step actually taken in float
    *x = static_cast<float>(saved - h);
    const double down = f();
    const double h_down = saved - static_cast<double>(*x);
    *x = saved;
    return (up - down) / (h_up + h_down);
}

// Richardson extrapolation of two central differences, (4 D(h/2) - D(h)) / 3: the O(h^2) truncation
// error cancels, so h can be large enough that fp32 rounding noise in f stays small.
inline double richardson_difference(const std::function<double()>& f, float* x, double h) {
    return (4.0 * central_difference(f, x, h / 2) - central_difference(f, x, h)) / 3.0;
}

// |a - b| <= atol + rtol * |b|, with a message that shows both.
inline ::testing::AssertionResult Near(double actual, double expected, double rtol, double atol) {
    const double err = std::abs(actual - expected);
    if (err <= atol + rtol * std::abs(expected)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "actual " << actual << " vs expected " << expected << " (error " << err
                                         << " > " << atol << " + " << rtol << " * |expected|)";
}

// Op-level gradient checks (cpu_ops_test, cpu_head_norm_test): L = sum(out * r) for a random r, and
// every element of `analytic` against the central difference of `loss` in `x`. Inputs are O(1): a
// step of 1e-2 keeps the truncation error (~h^2) and the fp32 rounding noise of the forward
// (~1e-7 / h) both near 1e-5, far below the tolerances.
inline double weighted_sum(const std::vector<float>& out, const std::vector<float>& r) {
    double s = 0.0;
    for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * r[i];
    return s;
}

inline void expect_gradient(const char* what, std::vector<float>& x, const std::vector<float>& analytic,
                            const std::function<double()>& loss) {
    constexpr double kStep = 1e-2, kRtol = 2e-3, kAtol = 2e-4;
    ASSERT_EQ(x.size(), analytic.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double fd = central_difference(loss, &x[i], kStep);
        EXPECT_TRUE(Near(analytic[i], fd, kRtol, kAtol)) << what << "[" << i << "]";
    }
}

}  // namespace qtrain::test
