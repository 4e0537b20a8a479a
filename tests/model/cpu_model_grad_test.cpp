// Whole-model gradients of the CPU reference model against central finite differences of its own
// fp32 forward, for every parameter tensor, tied and untied.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_test_util.h"
#include "model/cpu/cpu_model.h"

namespace qtrain {
namespace {

using test::Near;
using test::richardson_difference;

// Weights well away from init (init has ones for norms and zeros for biases, where some gradient
// bugs cancel) and large enough that attention and SwiGLU are far from linear.
void randomize(CpuModel& m, uint64_t seed) {
    Rng rng(seed);
    for (const auto& s : m.params()) {
        float* p = m.param(s.name);
        for (int64_t i = 0; i < s.numel(); ++i) {
            const float z = rng.normal();
            switch (s.kind) {
                case ParamKind::Norm:
                    p[i] = 1.0f + 0.2f * z;
                    break;
                case ParamKind::Bias:
                    p[i] = 0.2f * z;
                    break;
                default:
                    p[i] = 0.3f * z;
                    break;
            }
        }
    }
}

void check_all_gradients(const ModelConfig& cfg) {
    ModelOptions opt = CpuModel::fp32_options(2, 5);
    opt.lmhead_chunks = 3;
    CpuModel model(cfg, opt);
    randomize(model, 42);
    const test::TokenBatch tb = test::random_batch(2, 5, cfg.vocab_size, 7, /*mask_every=*/3);
    const Batch batch = tb.view();
    model.forward_backward(batch, 1.0f);

    auto loss = [&] { return model.evaluate_f64(batch); };
    // The fp32 forward is noisy at ~1e-7 of the loss, which a difference quotient divides by the step:
    // steps of 1e-2 and 2e-2 keep that near 1e-5 (the absolute floor), and Richardson extrapolation
    // removes their O(h^2) truncation error, so the relative tolerance can stay at 1e-3.
    const double h = 2e-2, rtol = 1e-3, atol = 3e-5;
    Rng pick(99);
    int checked = 0;
    for (const auto& s : model.params()) {
        const float* g = model.grad(s.name);
        float* p = model.param(s.name);
        // The largest gradient of the tensor (a strong signal) plus a few random elements.
        int64_t largest = 0;
        for (int64_t i = 1; i < s.numel(); ++i)
            if (std::abs(g[i]) > std::abs(g[largest])) largest = i;
        std::vector<int64_t> idx = {largest};
        for (int k = 0; k < 4; ++k) idx.push_back(static_cast<int64_t>(pick.below(s.numel())));
        EXPECT_GT(std::abs(g[largest]), 1e-3) << s.name << ": gradient is (almost) zero everywhere";
        for (int64_t i : idx) {
            const double fd = richardson_difference(loss, p + i, h);
            EXPECT_TRUE(Near(g[i], fd, rtol, atol)) << s.name << "[" << i << "]";
            ++checked;
        }
    }
    EXPECT_EQ(checked, 5 * static_cast<int>(model.params().size()));
}

TEST(CpuModelGradients, EveryTensorMatchesFiniteDifferencesUntied) { check_all_gradients(test::tiny_config(false)); }
TEST(CpuModelGradients, EveryTensorMatchesFiniteDifferencesTied) { check_all_gradients(test::tiny_config(true)); }

// Qwen3's block: q/k norms (weights away from one by randomize) before RoPE, no biases, head_dim 6
// where hidden / heads is 4.
TEST(CpuModelGradients, Qwen3BlockMatchesFiniteDifferences) {
    for (bool tied : {false, true}) {
        SCOPED_TRACE(tied ? "tied" : "untied");
        check_all_gradients(test::tiny_qwen3_config(tied));
    }
}

// Llama's block with every optional bias (attention_bias and mlp_bias true) and llama3 RoPE whose
// scaling changes every frequency of the tiny head (one blended, two divided by the factor).
TEST(CpuModelGradients, LlamaBlockWithBiasesMatchesFiniteDifferences) {
    ModelConfig cfg = test::tiny_llama_config(false);
    cfg.qkv_bias = cfg.o_bias = cfg.mlp_bias = true;
    check_all_gradients(cfg);
}

// Gradients accumulate over micro-batches, scaled by grad_scale: two half-weight passes over the same
// micro-batch give the gradient of one full-weight pass (up to the rounding of the running sums).
TEST(CpuModelGradients, AccumulationAndGradScale) {
    const ModelConfig cfg = test::tiny_config(true);
    const test::TokenBatch tb = test::random_batch(2, 6, cfg.vocab_size, 8, 4);
    CpuModel a(cfg, CpuModel::fp32_options(2, 6)), b(cfg, CpuModel::fp32_options(2, 6));
    a.init_random(1);
    b.init_random(1);
    a.forward_backward(tb.view(), 1.0f);
    b.forward_backward(tb.view(), 0.5f);
    b.forward_backward(tb.view(), 0.5f);
    for (const auto& s : a.params())
        for (int64_t i = 0; i < s.numel(); ++i)
            ASSERT_TRUE(Near(b.grad(s.name)[i], a.grad(s.name)[i], 1e-5, 1e-9)) << s.name << "[" << i << "]";
    EXPECT_EQ(a.step_loss(), b.step_loss());
    // evaluate() runs the same forward: the same loss, bit for bit, and no gradients touched.
    std::vector<float> before(a.grad("model.norm.weight"), a.grad("model.norm.weight") + cfg.hidden_size);
    EXPECT_EQ(static_cast<float>(a.step_loss()), a.evaluate(tb.view()));
    EXPECT_EQ(0, std::memcmp(before.data(), a.grad("model.norm.weight"), sizeof(float) * cfg.hidden_size));
}

// The LM-head chunking is a memory knob: it must not change the loss, and changes gradients only by
// the rounding of summing the LM-head weight gradient chunk by chunk.
TEST(CpuModelGradients, LmHeadChunksAgree) {
    const ModelConfig cfg = test::tiny_config(false);
    const test::TokenBatch tb = test::random_batch(3, 7, cfg.vocab_size, 9, 5);
    ModelOptions o1 = CpuModel::fp32_options(3, 7), o4 = o1;
    o4.lmhead_chunks = 4;
    CpuModel a(cfg, o1), b(cfg, o4);
    a.init_random(2);
    b.init_random(2);
    a.forward_backward(tb.view(), 1.0f);
    b.forward_backward(tb.view(), 1.0f);
    EXPECT_EQ(a.step_loss(), b.step_loss());
    for (const auto& s : a.params())
        for (int64_t i = 0; i < s.numel(); ++i)
            ASSERT_TRUE(Near(b.grad(s.name)[i], a.grad(s.name)[i], 1e-4, 1e-8)) << s.name << "[" << i << "]";
}

// Fully masked micro-batches contribute nothing (and do not divide by zero).
TEST(CpuModelGradients, FullyMaskedBatchHasNoLossAndNoGradient) {
    const ModelConfig cfg = test::tiny_config(true);
    test::TokenBatch tb = test::random_batch(1, 4, cfg.vocab_size, 10);
    std::fill(tb.targets.begin(), tb.targets.end(), -1);
    CpuModel m(cfg, CpuModel::fp32_options(1, 4));
    m.init_random(3);
    m.forward_backward(tb.view(), 1.0f);
    EXPECT_EQ(m.step_loss(), 0.0);
    for (const auto& s : m.params())
        for (int64_t i = 0; i < s.numel(); ++i) ASSERT_EQ(m.grad(s.name)[i], 0.0f) << s.name;
}

}  // namespace
}  // namespace qtrain
