// Where each parameter lives in the GPU model's flat buffers (weights, master, gradients, Adam m/v
// share this layout). The order fuses what the GPU computes together: per layer q|k|v weights are
// adjacent (one [q+2kv, h] matrix, one GEMM), so are their biases, and gate|up (one [2I, h]
// matrix). Each tensor starts on a 64-element boundary (aligned vector loads, cuBLASLt alignment);
// the padding is zero and never updated. HF names map to these offsets for import and export.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/model_config.h"
#include "model/parameters.h"

namespace qtrain {

struct GpuLayerOffsets {
    int64_t ln1, qkv_w, qkv_b, o_w, ln2, gate_up_w, down_w;
};

struct GpuParamLayout {
    std::vector<ParamSpec> specs;      // canonical HF tensors, in GPU order
    std::vector<int64_t> offsets;      // offset of specs[i] in the flat buffers
    std::vector<GpuLayerOffsets> layers;
    int64_t embed = 0, final_norm = 0, lm_head = 0;  // lm_head == embed when tied
    int64_t total = 0;                 // elements, padding included

    int64_t offset_of(const std::string& name) const;  // throws naming the tensor
    const ParamSpec& spec_of(const std::string& name) const;

    std::unordered_map<std::string, int> index;
};

GpuParamLayout make_gpu_layout(const ModelConfig& cfg);

}  // namespace qtrain
