#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "train/lr_schedule.h"

using namespace qtrain;

TEST(LrSchedule, WarmupIsLinearFromPeakOverWarmup) {
    LrSchedule s{.peak_lr = 1.0f, .total_steps = 100, .warmup_steps = 4};
    EXPECT_FLOAT_EQ(s.at(0), 0.25f);
    EXPECT_FLOAT_EQ(s.at(1), 0.5f);
    EXPECT_FLOAT_EQ(s.at(3), 1.0f);
}

TEST(LrSchedule, ConstantWhenFinalFractionIsOne) {
    LrSchedule s{.peak_lr = 3e-4f, .total_steps = 50, .warmup_steps = 0, .final_lr_fraction = 1.0f};
    for (int i = 0; i < 50; ++i) EXPECT_FLOAT_EQ(s.at(i), 3e-4f);
}

TEST(LrSchedule, CosineGoesFromPeakToFinalFraction) {
    LrSchedule s{.peak_lr = 1.0f, .total_steps = 110, .warmup_steps = 10, .final_lr_fraction = 0.1f};
    EXPECT_FLOAT_EQ(s.at(10), 1.0f);                 // start of decay = peak
    EXPECT_NEAR(s.at(60), 0.55f, 1e-6);              // halfway: (peak + final) / 2
    EXPECT_NEAR(s.at(110), 0.1f, 1e-6);              // end of decay
    // monotone decreasing after warmup
    for (int i = 11; i < 110; ++i) EXPECT_LE(s.at(i), s.at(i - 1));
    // cosine shape at a quarter: final + (peak-final) * (1 + cos(pi/4)) / 2
    EXPECT_NEAR(s.at(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-6);
}

TEST(LrSchedule, LinearDecay) {
    LrSchedule s{.peak_lr = 2.0f, .total_steps = 100, .warmup_steps = 0, .final_lr_fraction = 0.0f,
                 .decay = LrDecay::Linear};
    EXPECT_FLOAT_EQ(s.at(0), 2.0f);
    EXPECT_NEAR(s.at(25), 1.5f, 1e-6);
    EXPECT_NEAR(s.at(50), 1.0f, 1e-6);
}

TEST(LrSchedule, SqrtCooldownAfterConstantPhase) {
    // WSD: constant at peak, then 1 - sqrt(k / cooldown) over the last 16 steps.
    LrSchedule s{.peak_lr = 1.0f, .total_steps = 100, .warmup_steps = 0, .cooldown_steps = 16, .final_lr_fraction = 1.0f};
    EXPECT_FLOAT_EQ(s.at(83), 1.0f);
    EXPECT_FLOAT_EQ(s.at(84), 1.0f);                              // k = 0
    EXPECT_NEAR(s.at(88), 1.0 - std::sqrt(4.0 / 16), 1e-6);       // k = 4 -> 0.5
    EXPECT_NEAR(s.at(99), 1.0 - std::sqrt(15.0 / 16), 1e-6);      // last step, > 0
    EXPECT_GT(s.at(99), 0.0f);
}

TEST(LrSchedule, CooldownStartsFromTheDecayedValue) {
    LrSchedule s{.peak_lr = 1.0f, .total_steps = 20, .warmup_steps = 0, .cooldown_steps = 10,
                 .final_lr_fraction = 0.5f, .decay = LrDecay::Linear};
    EXPECT_NEAR(s.at(10), 0.5f, 1e-6);                            // end of decay phase, k = 0
    EXPECT_NEAR(s.at(14), 0.5 * (1 - std::sqrt(0.4)), 1e-6);
}

TEST(LrSchedule, ParseDecay) {
    EXPECT_EQ(parse_lr_decay("cosine"), LrDecay::Cosine);
    EXPECT_EQ(parse_lr_decay("linear"), LrDecay::Linear);
    EXPECT_THROW(parse_lr_decay("exp"), Error);
}
