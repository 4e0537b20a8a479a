// Where the GPU model keeps its LoRA adapters (issue 33, model/lora.h): one flat fp32 space of every
// adapter tensor (each on a 64-element boundary like gpu_layout.h), then --train-also's base tensors
// (lora_train_also_parameters(), CpuLora's order), over which the master, the gradient, Adam's moments
// and the model-dtype copy the GEMMs read all share offsets; and the memory of the adapters'
// activations. Tensors are matched to the host mirror's files by name (specs[i] at offsets[i]), so the
// device's order is free: per layer its A's come first, in target order, then its B's, which puts the
// A's of targets that read one input (q|k|v, gate|up) next to each other, one [G r, in] matrix that a
// single GEMM reads (LoraAdapters' stacked path). CUDA-free: the memory plan (gpu_buffers.h) binds
// these without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/lora.h"
#include "model/model_config.h"
#include "model/parameters.h"

namespace qtrain {

struct LoraLayout {
    std::vector<ParamSpec> specs;  // lora_parameters() (PEFT's order): per layer, per target, A then B; then --train-also's
    std::size_t first_trained = 0;  // specs[first_trained..]: the --train-also tensors (PEFT names)
    std::vector<std::string> trained_base;  // their HF names in the base, one per --train-also tensor
    std::vector<int64_t> offsets;  // of specs[i] in the flat adapter space (not increasing with i: see above)
    int64_t total = 0;             // elements, padding included (a multiple of 64)
    // per (layer, target), index l * kLoraTargets + t: A's and B's offsets, -1 where t has no adapter
    std::vector<int64_t> a_offset, b_offset;
    std::vector<int64_t> a_numel;  // per (layer, target): r x in of its A (0 none)
    // per (layer, target): the adapter's slot among the saved x A^T of every adapter ([slots, N, r]), -1 none
    std::vector<int> saved_slot;
    int slots = 0;
    // The most targets of one fused matrix (q|k|v: up to 3) that run stacked: their A's adjacent (the
    // padding of [r, in] is nothing when r x in is a multiple of 64) and their saved u the columns of
    // one [N, G r] matrix (consecutive slots); without dropout (each target's mask differs). 1: none.
    // The backward's g of a stacked matrix is [N, G r] (buf_.dh).
    int widest_stack = 1;
    int64_t widest_input = 0;  // the largest `in` of an adapted target (the dropout scratch's width)
    int rank = 0;
    bool enabled() const { return rank > 0; }
    int index(int l, LoraTarget t) const { return l * kLoraTargets + static_cast<int>(t); }
    bool has(int l, LoraTarget t) const { return enabled() && a_offset[index(l, t)] >= 0; }
    // Whether the adapters of `targets` (n of them, in target order, each with one) of layer l run
    // stacked: n > 1, all reading one input (of q|k|v, or of gate|up), no dropout, A's adjacent,
    // slots consecutive.
    bool stacked(int l, const LoraTarget* targets, int n) const;
    bool dropout = false;
};

LoraLayout make_lora_layout(const ModelConfig& cfg, const LoraOptions& lora);

}  // namespace qtrain
