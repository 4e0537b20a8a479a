// Speed of light: the tokens/s a device would reach running only the necessary matmul FLOPs at its
// peak rate (backends/peak_rates.h). The [T] line's "sol" is measured tokens/s over that.
#pragma once

#include <string>

#include "model/model_config.h"

namespace qtrain {

// Matmul FLOPs per trained token: 6 * (matmul parameters, LM head included) for forward+backward,
// plus causal attention 6 * layers * seq_len * q_dim (QK^T and PV, half the square, fwd+bwd).
double training_flops_per_token(const ModelConfig& cfg, int seq_len);

}  // namespace qtrain
