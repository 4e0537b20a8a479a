// The parameter tensors of a model, in HF names and shapes, in one canonical order. Every
// backend, the checkpoint format and the HF export use this list, so a tensor means the same thing
// everywhere. (The GPU model may fuse q/k/v or gate/up internally; it still exports these.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace qtrain {

enum class ParamKind : uint8_t { Embedding, Matrix, Bias, Norm };

struct ParamSpec {
    std::string name;            // HF name, e.g. "model.layers.3.self_attn.q_proj.weight"
    std::vector<int64_t> shape;  // HF shape, row-major: Linear weights are [out, in]
    ParamKind kind;
    int layer = -1;              // -1 for embeddings, final norm and LM head
    int64_t numel() const {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        return n;
    }
    // AdamW weight decay applies to matrices and embeddings only, never to norms or biases.
    bool decay() const { return kind == ParamKind::Embedding || kind == ParamKind::Matrix; }
};

// Canonical order: embed_tokens, then per layer (input_layernorm, q/k/v/o_proj weight (+ bias),
// q_norm, k_norm, post_attention_layernorm, gate/up/down weight (+ bias)), then model.norm, then
// lm_head (absent when tied). Which biases and norms a layer has comes from the block's optional
// steps in `cfg` (set from the architecture description, arch/architecture.h): Qwen2 has q/k/v
// biases, Qwen3 q_norm and k_norm, Llama neither (unless attention_bias / mlp_bias).
std::vector<ParamSpec> model_parameters(const ModelConfig& cfg);

// Deterministic initialisation of one tensor, independent of the order tensors are initialised
// in: normal(0, initializer_range) for matrices and embeddings, ones for norms, zeros for biases
// (as HF's _init_weights). The stream is seeded by hash(seed, name).
void init_parameter(const ParamSpec& spec, const ModelConfig& cfg, uint64_t seed, float* out);

}  // namespace qtrain
