// The shape of a decoder model of one of the supported families (Qwen2/Qwen2.5, Qwen3, Llama 3.x):
// read from a HF config.json or taken from a built-in preset. Which family it is and which optional
// steps its block has come from the architecture description (model/arch/architecture.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qtrain {

struct ModelConfig {
    std::string architecture = "Qwen2ForCausalLM";
    std::string model_type = "qwen2";
    int vocab_size = 0;
    int hidden_size = 0;
    int intermediate_size = 0;
    int num_hidden_layers = 0;
    int num_attention_heads = 0;
    int num_key_value_heads = 0;
    int head_dim = 0;  // config.json's head_dim (Qwen3, Llama), else hidden_size / num_attention_heads
    int max_position_embeddings = 32768;
    double rope_theta = 1000000.0;
    // RoPE frequencies: "default" (plain) or "llama3" (Llama 3.1+: low frequencies divided by
    // `rope_factor`, a smooth ramp between `rope_low_freq_factor` and `rope_high_freq_factor` of the
    // wavelength `rope_original_max_position_embeddings`), as transformers' rope_init_fn computes them.
    std::string rope_type = "default";
    double rope_factor = 1.0;
    double rope_low_freq_factor = 1.0;
    double rope_high_freq_factor = 4.0;
    int rope_original_max_position_embeddings = 0;
    double rms_norm_eps = 1e-6;
    bool tie_word_embeddings = false;
    // The optional steps of a block (set by the family and its config fields, see arch/architecture.h):
    bool qkv_bias = true;   // q/k/v projections have biases (Qwen2 always; Llama/Qwen3: attention_bias)
    bool o_bias = false;    // o_proj has a bias (Llama/Qwen3: attention_bias)
    bool mlp_bias = false;  // gate/up/down have biases (Llama: mlp_bias)
    bool qk_norm = false;   // per-head RMSNorm of q and k before RoPE (Qwen3: q_norm, k_norm)
    // Token ids: -1 when config.json has none (null). pad_token_id changes the training math as in
    // transformers (nn.Embedding's padding_idx): the lookup's backward gives that row no gradient
    // (tied models still get the LM head's); bos/eos are only recorded.
    int bos_token_id = 151643;
    int eos_token_id = 151643;
    int pad_token_id = -1;
    bool use_sliding_window = false;
    int sliding_window = 0;
    int max_window_layers = 0;
    std::string hidden_act = "silu";
    double initializer_range = 0.02;
    std::string torch_dtype = "bfloat16";  // config.json "dtype" (transformers 5) or "torch_dtype"
    double attention_dropout = 0.0;

    int q_dim() const { return num_attention_heads * head_dim; }
    int kv_dim() const { return num_key_value_heads * head_dim; }
    // Number of parameters (embeddings counted once when tied).
    int64_t num_parameters() const;

    // Throws qtrain::Error naming `source` if the shape is inconsistent.
    void validate(const std::string& source) const;
};

// Parses a HF config.json (text) as transformers 4.x and 5.x write it (RoPE base as top-level
// 'rope_theta' or in 'rope_parameters'). `source` names the file in error messages. Rejects
// architectures other than those of arch/architecture.h, files whose forms disagree, and every field
// that transformers reads for that family at a value qtrain does not implement (RoPE types other than
// default and llama3, partial rotary, sliding window, dropout, quantization, ...).
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
ModelConfig load_model_config(const std::string& config_json_path);
// Writes a config.json (text) that transformers 4.x and 5.x load to the same model.
std::string model_config_to_json(const ModelConfig& cfg);

// Built-in presets with the published shapes: Qwen2.5-0.5B ... -32B, Qwen3-0.6B ... -32B,
// Llama-3.2-1B, -3B, Llama-3.1-8B. Accepts the bare name ("Qwen2.5-0.5B") or with org
// ("Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B").
bool has_preset(const std::string& name);
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();
// "Qwen2.5-0.5B, -1.5B, ..., Qwen3-0.6B, ..., Llama-3.1-8B" for --help.
std::string preset_list_text();

}  // namespace qtrain
