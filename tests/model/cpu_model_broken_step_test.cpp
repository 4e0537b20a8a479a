// A broken step (a non-finite gradient or loss, or a gradient of exactly zero) must leave the model as
// it was: the engine stops on it, and nothing it could checkpoint afterwards may hold the damage.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "model/cpu/cpu_model.h"
#include "model/cpu_test_util.h"

using namespace qtrain;

namespace {

struct Snapshot {
    std::vector<float> params, m, v;
    explicit Snapshot(CpuModel& model) {
        for (const auto& s : model.params()) {
            const int64_t n = s.numel();
            params.insert(params.end(), model.param(s.name), model.param(s.name) + n);
            m.insert(m.end(), model.adam_m(s.name), model.adam_m(s.name) + n);
            v.insert(v.end(), model.adam_v(s.name), model.adam_v(s.name) + n);
        }
    }
};

// One healthy step (so the moments are non-zero and a skipped update would show), then a step whose
// gradient is poisoned by `poison`.
void expect_step_skipped(float poison) {
    const ModelConfig cfg = test::tiny_config(false);
    CpuModel model(cfg, CpuModel::fp32_options(2, 8));
    model.init_random(3);
    const test::TokenBatch tb = test::random_batch(2, 8, cfg.vocab_size, 5);
    OptimizerParams o;
    o.learning_rate = 1e-2f;
    o.weight_decay = 0.1f;
    model.forward_backward(tb.view(), 1.0f);
    ASSERT_TRUE(IModel::update_allowed(model.optimizer_step(o)));
    const Snapshot before(model);

    model.forward_backward(tb.view(), 1.0f);
    const std::string name = model.params()[3].name;
    if (poison == 0.0f) {  // a vanished gradient: every element exactly zero
        for (const auto& s : model.params()) std::fill(model.grad(s.name), model.grad(s.name) + s.numel(), 0.0f);
    } else {
        model.grad(name)[1] = poison;
    }
    o.step = 2;
    const StepStats stats = model.optimizer_step(o);
    EXPECT_FALSE(IModel::update_allowed(stats)) << "loss " << stats.loss << ", norm " << stats.grad_norm;
    const Snapshot after(model);
    EXPECT_EQ(after.params, before.params) << "the weights changed in a broken step";
    EXPECT_EQ(after.m, before.m) << "Adam's first moment changed in a broken step";
    EXPECT_EQ(after.v, before.v) << "Adam's second moment changed in a broken step";
    for (const auto& s : model.params())
        for (int64_t i = 0; i < s.numel(); ++i) ASSERT_EQ(model.grad(s.name)[i], 0.0f) << s.name << " not cleared";
    EXPECT_EQ(model.step_loss(), 0.0);

    // and the model trains on normally afterwards
    model.forward_backward(tb.view(), 1.0f);
    o.step = 3;
    EXPECT_TRUE(IModel::update_allowed(model.optimizer_step(o)));
}

}  // namespace

TEST(CpuModelBrokenStep, NanGradientLeavesWeightsAndMomentsUntouched) {
    expect_step_skipped(std::numeric_limits<float>::quiet_NaN());
}

TEST(CpuModelBrokenStep, InfiniteGradientLeavesWeightsAndMomentsUntouched) {
    expect_step_skipped(std::numeric_limits<float>::infinity());
}

TEST(CpuModelBrokenStep, VanishedGradientLeavesWeightsAndMomentsUntouched) { expect_step_skipped(0.0f); }
