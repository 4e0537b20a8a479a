// The architecture description: what one decoder family (a transformers `*ForCausalLM` class) is made
// of, as data. Everything that differs between Qwen2, Qwen3 and Llama 3 is here, and the rest of qtrain
// reads it instead of naming a family: config.json parsing and writing (model_config.cpp), the
// parameter list and its HF names (parameters.cpp, from the block's optional steps kept in
// ModelConfig), the CPU and GPU layouts and block math (which follow the parameter list and the
// ModelConfig flags), presets and the memory plan. A new family of the same block shape (pre-norm
// RMSNorm, GQA attention with RoPE, SwiGLU MLP) is one more entry in the table of architecture.cpp.
#pragma once

#include <string>
#include <vector>

namespace qtrain {

struct ModelConfig;

struct Architecture {
    const char* hf_class;    // config.json "architectures"[0], e.g. "Qwen2ForCausalLM"
    const char* model_type;  // config.json "model_type", e.g. "qwen2"
    // How the config's fields become the block's optional steps:
    bool fixed_qkv_bias;        // q/k/v always have biases, o_proj never (Qwen2: no config field)
    bool reads_attention_bias;  // 'attention_bias' gives biases to q, k, v and o_proj (Llama, Qwen3)
    bool reads_mlp_bias;        // 'mlp_bias' gives biases to gate, up and down (Llama)
    bool qk_norm;               // per-head RMSNorm of q and k before RoPE, 'q_norm'/'k_norm' (Qwen3)
    bool free_head_dim;         // 'head_dim' may differ from hidden_size / heads (Qwen3, Llama)
    int default_head_dim;       // the config class's head_dim when the file has none; 0: hidden / heads
    bool sliding_window_fields; // reads use_sliding_window / sliding_window / max_window_layers / layer_types
    bool reads_pretraining_tp;  // Llama's 'pretraining_tp' (must be 1)
    // Defaults of the config class for fields a config.json may leave out.
    int default_max_position_embeddings;
};

// The families qtrain trains, in the order --help lists them.
const std::vector<Architecture>& architectures();
// The family of a config.json: by its "architectures" entry, or by model_type when that is absent.
// nullptr when qtrain does not implement it.
const Architecture* find_architecture(const std::string& hf_class, const std::string& model_type);
// The family of a parsed config (its `architecture`); throws for an unknown one.
const Architecture& architecture_of(const ModelConfig& cfg);
// "Qwen2ForCausalLM (qwen2), Qwen3ForCausalLM (qwen3), LlamaForCausalLM (llama)", for messages.
std::string supported_architectures_text();

}  // namespace qtrain
