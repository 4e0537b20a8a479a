// The peak matmul rates of a device, for the [T] line's "sol" (train/sol.h).
#pragma once

#include <string>

#include "core/dtype.h"

namespace qtrain {

struct PeakRates {
    double fp32 = 0, bf16 = 0, fp8 = 0;  // FLOP/s, dense
    double for_matmul(DType t) const;
};

// Known GPUs by name (H200: bf16 989 TFLOP/s, fp8 1979); otherwise estimated from SM count and clock
// (Hopper-class 1024 dense bf16 FLOP/clk/SM, Ampere/Ada 512). Never zero for a GPU.
PeakRates gpu_peak_rates(const std::string& name, int sm_count, int clock_mhz, int cc_major);
// The host CPU: cores * clock * FLOP/cycle from the vector width (AVX-512: 64 fp32, AVX2: 32).
PeakRates cpu_peak_rates(std::string* description = nullptr);

}  // namespace qtrain
