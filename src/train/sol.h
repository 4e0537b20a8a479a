// Speed of light: the tokens/s a device would reach running only the necessary matmul FLOPs at its
// peak rate. The [T] line's "sol" is measured tokens/s over that.
#pragma once

#include <string>

#include "core/dtype.h"
#include "model/model_config.h"

namespace qtrain {

// Matmul FLOPs per trained token: 6 * (matmul parameters, LM head included) for forward+backward,
// plus causal attention 6 * layers * seq_len * q_dim (QK^T and PV, half the square, fwd+bwd).
double training_flops_per_token(const ModelConfig& cfg, int seq_len);

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
