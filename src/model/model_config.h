// The shape of a Qwen2 model: read from a HF config.json or taken from a built-in preset.
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
    int head_dim = 0;  // hidden_size / num_attention_heads (Qwen2 has no separate field)
    int max_position_embeddings = 32768;
    double rope_theta = 1000000.0;
    double rms_norm_eps = 1e-6;
    bool tie_word_embeddings = false;
    bool attention_bias = true;  // Qwen2: q/k/v projections have biases, o_proj has none
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
// architectures other than Qwen2ForCausalLM, files whose forms disagree, and every field that
// transformers' Qwen2 reads at a value qtrain does not implement (RoPE scaling, partial rotary,
// sliding window, dropout, quantization, ...).
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
ModelConfig load_model_config(const std::string& config_json_path);
// Writes a config.json (text) that transformers 4.x and 5.x load to the same model.
std::string model_config_to_json(const ModelConfig& cfg);

// Built-in presets with the published shapes: Qwen2.5-0.5B, -1.5B, -3B, -7B, -14B, -32B.
// Accepts the bare name ("Qwen2.5-0.5B") or with org ("Qwen/Qwen2.5-0.5B").
bool has_preset(const std::string& name);
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace qtrain
