#include <gtest/gtest.h>

#include "model/model_config.h"
#include "backends/peak_rates.h"
#include "train/sol.h"

using namespace qtrain;

TEST(Sol, KnownGpusUseTheirDatasheetPeaks) {
    PeakRates h200 = gpu_peak_rates("NVIDIA H200", 132, 1980, 9);
    EXPECT_DOUBLE_EQ(h200.bf16, 989e12);
    EXPECT_DOUBLE_EQ(h200.fp8, 1979e12);
    EXPECT_DOUBLE_EQ(h200.for_matmul(DType::E4M3), 1979e12);
    EXPECT_DOUBLE_EQ(h200.for_matmul(DType::BF16), 989e12);
}

TEST(Sol, UnknownGpusFallBackToSmsTimesClockNeverZero) {
    PeakRates r = gpu_peak_rates("Some Future GPU", 100, 2000, 9);
    EXPECT_DOUBLE_EQ(r.bf16, 1024.0 * 100 * 2000e6);  // Hopper-class dense bf16 per SM per clock
    EXPECT_GT(r.fp8, r.bf16);
    PeakRates old = gpu_peak_rates("Some Old GPU", 80, 1500, 8);
    EXPECT_GT(old.bf16, 0);
    EXPECT_GT(old.for_matmul(DType::E4M3), 0);  // falls back to the bf16 rate, never blank
    EXPECT_GT(cpu_peak_rates().fp32, 0);
}

TEST(Sol, FlopsPerTokenCountsMatmulsAndCausalAttention) {
    ModelConfig c = preset_config("Qwen2.5-0.5B");
    const double f = training_flops_per_token(c, 1024);
    // 6 x (24 layers x 14.9M matmul params + 136M LM head) + 6 x 24 x 1024 x 896
    const double per_layer = 896.0 * 896 + 2 * 896.0 * 128 + 896.0 * 896 + 3 * 896.0 * 4864;
    EXPECT_DOUBLE_EQ(f, 6 * (24 * per_layer + 151936.0 * 896) + 6.0 * 24 * 1024 * 896);
    EXPECT_NEAR(f / 1e9, 3.10, 0.01);
}
