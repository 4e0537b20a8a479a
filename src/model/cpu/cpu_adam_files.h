// How a CPU checkpoint holds a set of fp32 tensors kept in flat arrays (their values, and AdamW's
// first and second moments): the weights file holds each tensor by its name, the optimizer file
// `name.exp_avg` and `name.exp_avg_sq`. The full CPU model and its LoRA adapters both write and read
// their state this way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/parameters.h"

namespace qtrain {

// Tensor i of `specs` starts at offsets[i] in each of p, m, v.
void add_adam_state(SafeTensorsWriter& weights, SafeTensorsWriter& optimizer, const std::vector<ParamSpec>& specs,
                    const std::vector<int64_t>& offsets, const float* p, const float* m, const float* v);

// Reads them back (finite values, the specs' shapes); a missing tensor names the checkpoint `dir`.
void read_adam_state(const SafeTensorsReader& weights, const SafeTensorsReader& optimizer,
                     const std::vector<ParamSpec>& specs, const std::vector<int64_t>& offsets, float* p, float* m,
                     float* v, const std::string& dir);

}  // namespace qtrain
