// Where the GPU model keeps its LoRA adapters (issue 33, model/lora.h): one flat fp32 space of every
// adapter tensor (PEFT's order, lora_parameters(), each tensor on a 64-element boundary like
// gpu_layout.h), then --train-also's base tensors (lora_train_also_parameters(), CpuLora's order, so
// the host mirror's files and the device agree tensor by tensor), over which the master, the gradient, Adam's moments and the model-dtype copy the
// GEMMs read all share offsets; and the memory of the adapters' activations. CUDA-free: the memory
// plan (gpu_buffers.h) binds these without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/lora.h"
#include "model/model_config.h"
#include "model/parameters.h"

namespace qtrain {

struct LoraLayout {
    std::vector<ParamSpec> specs;  // lora_parameters(): per layer, per target, A then B; then --train-also's
    std::size_t first_trained = 0;  // specs[first_trained..]: the --train-also tensors (PEFT names)
    std::vector<std::string> trained_base;  // their HF names in the base, one per --train-also tensor
    std::vector<int64_t> offsets;  // of specs[i] in the flat adapter space
    int64_t total = 0;             // elements, padding included (a multiple of 64)
    // per (layer, target), index l * kLoraTargets + t: A's and B's offsets, -1 where t has no adapter
    std::vector<int64_t> a_offset, b_offset;
    // per (layer, target): the adapter's slot among the saved x A^T of every adapter ([slots, N, r]), -1 none
    std::vector<int> saved_slot;
    int slots = 0;
    int64_t widest_input = 0;  // the largest `in` of an adapted target (the dropout scratch's width)
    int rank = 0;
    bool enabled() const { return rank > 0; }
    int index(int l, LoraTarget t) const { return l * kLoraTargets + static_cast<int>(t); }
    bool has(int l, LoraTarget t) const { return enabled() && a_offset[index(l, t)] >= 0; }
};

LoraLayout make_lora_layout(const ModelConfig& cfg, const LoraOptions& lora);

}  // namespace qtrain
