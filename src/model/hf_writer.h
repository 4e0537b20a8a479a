// The HF model directory qtrain writes (model.safetensors in canonical HF order, config.json with the
// stored dtype), from any source of the parameters: the GPU model's export and `train
// --export-checkpoint` (train/checkpoint_export.h) write it through this one function.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model_config.h"
#include "model/parameters.h"

namespace qtrain {

// `values(spec)` returns the fp32 values of one tensor; it is called one tensor at a time while the
// file is written (a 7B model is 30 GB of fp32), and they are stored as `store` (F32 or BF16).
void write_hf_model(const std::string& dir, const ModelConfig& config, DType store,
                    const std::function<std::vector<float>(const ParamSpec&)>& values);

}  // namespace qtrain
