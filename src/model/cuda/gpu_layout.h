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

// Offsets of one layer's tensors; -1 for an optional one the block does not have (ModelConfig's
// qkv_bias, o_bias, qk_norm, mlp_bias).
struct GpuLayerOffsets {
    int64_t ln1, qkv_w, qkv_b, o_w, o_b, q_norm, k_norm, ln2, gate_up_w, gate_up_b, down_w, down_b;
    bool has_qkv_bias() const { return qkv_b >= 0; }
    bool has_o_bias() const { return o_b >= 0; }
    bool has_qk_norm() const { return q_norm >= 0; }
    bool has_mlp_bias() const { return gate_up_b >= 0; }
};

struct GpuParamLayout {
    std::vector<ParamSpec> specs;      // canonical HF tensors, in GPU order
    std::vector<int64_t> offsets;      // offset of specs[i] in the flat buffers
    std::vector<GpuLayerOffsets> layers;
    int64_t embed = 0, final_norm = 0, lm_head = 0;  // lm_head == embed when tied
    int64_t total = 0;                 // elements, padding included
    // Layer l's tensors fill [layer_begin(l), layer_begin(l) + layer_span), padding included, and
    // every layer has the same span; the rest (embedding, final norm, LM head) lies before
    // layer_begin(0) or from layers_end() on. Weight and gradient streaming move whole spans.
    int64_t layer_span = 0;
    int64_t layer_begin(int l) const { return layers.empty() ? 0 : layers[0].ln1 + l * layer_span; }
    int64_t layers_end() const { return layer_begin(static_cast<int>(layers.size())); }
    // The layer whose span holds element `off`, or -1 for the embedding, final norm and LM head.
    int layer_of(int64_t off) const {
        if (layers.empty() || off < layer_begin(0) || off >= layers_end()) return -1;
        return static_cast<int>((off - layer_begin(0)) / layer_span);
    }

    // The runs of layer l's span (padding included, in order) that hold its weight matrices
    // (`matrices`), or else its norm weights and biases: the FP8 paths quantise and move the two kinds
    // apart. Every layer has the same runs at its own offset.
    struct Range {
        int64_t begin, end;
    };
    std::vector<Range> layer_runs(int l, bool matrices) const;
    // The ranges of a layer's span, from its start, that hold no element of its weight matrices: its
    // norm weights, biases and every padding (layer_runs counts a tensor's padding with it). What a
    // gradient slot must zero when the matrices' weight-gradient GEMMs write the rest (gradients.h).
    std::vector<Range> layer_non_matrix_elements() const;
    // Whether element off (inside a layer) belongs to one of its matrices.
    bool in_matrix(int64_t off) const;
    std::vector<Range> matrix_runs0, small_runs0;  // layer 0's

    // Index of non-layer element off in a resident buffer (resident_weights / resident_grads) that
    // holds the embedding (first) only when `with_embedding`, then the final norm and the LM head.
    int64_t resident_index(int64_t off, bool with_embedding) const;

    // LoRA on an FP8 base that keeps no bf16 matrices (fp8_base_only, gpu_buffers.h): the model-dtype
    // weights buffer holds every tensor but the layers' matrices, in flat order: the elements before
    // layer_begin(0), then each layer's non-matrix runs (small_span elements per layer: its norms and
    // biases, padding included, so every tensor keeps its 64-element alignment), then the elements
    // from layers_end(). compact_index(off) is flat element off's index there (off not in a matrix:
    // throws naming the offset); compact_total() the buffer's elements.
    int64_t small_span = 0;
    int64_t compact_index(int64_t off) const;
    int64_t compact_total() const;

    int64_t offset_of(const std::string& name) const;  // throws naming the tensor
    const ParamSpec& spec_of(const std::string& name) const;

    std::unordered_map<std::string, int> index;
};

GpuParamLayout make_gpu_layout(const ModelConfig& cfg);

}  // namespace qtrain
