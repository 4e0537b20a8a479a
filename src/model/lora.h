// LoRA adapters (issue 33): what the options mean and which tensors they add, shared by every backend,
// the adapter export and the checkpoints. A target Linear y = x W^T (+ b) becomes
//   y = x W^T (+ b) + s * (x A^T) B^T,   A [r, in], B [out, r], s = alpha / r (PEFT's scaling),
// with W and b frozen. Adapter tensors are named as PEFT saves them for a causal LM
// ("base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight"), so the adapter file is PEFT's.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/parameters.h"

namespace qtrain {

// The projections an adapter can sit on, in the order of a layer's tensors (parameters.h).
enum class LoraTarget : int { Q, K, V, O, Gate, Up, Down };
constexpr int kLoraTargets = 7;
constexpr uint32_t kTrainNorms = 1, kTrainEmbeddings = 2;

// --lora-targets' short names ("q", ..., "down") and the HF module names PEFT's target_modules use.
const char* lora_target_name(LoraTarget t);
const char* lora_module_name(LoraTarget t);  // "q_proj", ..., "down_proj"
const char* lora_module_path(LoraTarget t);  // "self_attn.q_proj", ..., "mlp.down_proj"

struct LoraOptions {
    int rank = 0;              // 0 = off
    float alpha = 8.0f;        // PEFT's LoraConfig default lora_alpha
    float dropout = 0.0f;      // PEFT's lora_dropout on the adapters' input, training passes only
    uint32_t targets = 0x7f;   // bit t = LoraTarget t (default: all)
    std::string init = "kaiming";  // kaiming: PEFT's default (A Kaiming-uniform, B zero); gaussian: A ~ N(0, 1/r)
    uint64_t seed = 42;            // A's initialisation (--seed)
    std::string base_model;        // adapter_config.json's base_model_name_or_path (--model)
    std::string from;              // --lora-from: start from this PEFT adapter directory ("" = init)
    bool merge = false;            // --merge-lora: the export is the merged full model, not the adapter
    // --train-also: base tensors trained in full beside the adapters (fp32 master in the base, gradient
    // and AdamW moments with the adapters'): kTrainNorms = every RMSNorm weight, kTrainEmbeddings = the
    // embedding matrix and the LM head (one matrix when tied)
    uint32_t train_also = 0;
    bool enabled() const { return rank > 0; }
    bool has(LoraTarget t) const { return (targets >> static_cast<int>(t)) & 1u; }
    float scale() const { return alpha / static_cast<float>(rank); }
    bool operator==(const LoraOptions&) const = default;
};

// "all" or a comma-separated list of q,k,v,o,gate,up,down -> the bit mask; throws naming `flag` and
// the unknown entry.
uint32_t parse_lora_targets(const std::string& text, const std::string& flag);
// The mask back as text ("q,k,v,o,gate,up,down").
std::string lora_targets_text(uint32_t targets);

// --train-also: "" / "none", or a comma-separated list of norms,embeddings -> kTrain* bits; throws naming
// `flag` and the unknown entry. And back as text ("norms,embeddings", "" for none).
uint32_t parse_lora_train_also(const std::string& text, const std::string& flag);
std::string lora_train_also_text(uint32_t train_also);

// [out, in] of target t's Linear in `cfg`.
std::array<int64_t, 2> lora_target_shape(const ModelConfig& cfg, LoraTarget t);

// Throws (naming --lora-rank and the module) when the rank is larger than a target's dimensions, or
// the options are out of range (--lora-alpha, --lora-dropout, --lora-init).
void check_lora(const ModelConfig& cfg, const LoraOptions& lora);

// The adapter tensors, per layer in target order, A before B: PEFT's names, shapes [r, in] / [out, r],
// kind Matrix (AdamW decays them as PEFT's AdamW does, with the run's weight decay).
std::vector<ParamSpec> lora_parameters(const ModelConfig& cfg, const LoraOptions& lora);
// The base tensors --train-also trains (their HF names, shapes and kinds as model_parameters() has them,
// in its order); empty without LoRA or --train-also.
std::vector<ParamSpec> lora_train_also_base(const ModelConfig& cfg, const LoraOptions& lora);
// The same tensors as PEFT saves a modules_to_save module: "base_model.model." + the HF name
// ("base_model.model.model.norm.weight", "base_model.model.lm_head.weight").
std::vector<ParamSpec> lora_train_also_parameters(const ModelConfig& cfg, const LoraOptions& lora);
constexpr const char* kPeftPrefix = "base_model.model.";
// PEFT's adapter tensor name for layer l, target t, "lora_A" or "lora_B".
std::string lora_tensor_name(int layer, LoraTarget t, const char* which);

// Deterministic initialisation of one adapter tensor (seeded by hash(seed, name)): B = 0; A as PEFT's
// init_lora_weights=True, torch's kaiming_uniform_(a=sqrt(5)) = uniform(-1/sqrt(in), 1/sqrt(in)), or
// "gaussian": normal(0, 1/r).
void init_lora_parameter(const ParamSpec& spec, const LoraOptions& lora, uint64_t seed, float* out);

// ---- PEFT's adapter directory (adapter_config.json + adapter_model.safetensors) ----
constexpr const char* kAdapterConfigFile = "adapter_config.json";
constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";

// adapter_config.json as PEFT's LoraConfig writes it for these options (peft_type LORA, task_type
// CAUSAL_LM, r, lora_alpha, lora_dropout, target_modules as HF module names, bias none, ...). With
// --train-also, modules_to_save names the trained modules (PEFT matches them by suffix: the norms
// input_layernorm, post_attention_layernorm, norm (+ q_norm, k_norm); embed_tokens, lm_head), and a
// tied model's embeddings get ensure_weight_tying (PEFT then ties the LM head to the trained copy).
std::string peft_adapter_config_json(const LoraOptions& lora, const ModelConfig& cfg);
// Throws naming `flag`=dir when the adapter_config.json text is not a LoRA adapter these options
// can continue: another peft_type, rank, lora_alpha, set of target modules or of modules_to_save
// (--train-also), DoRA or rsLoRA.
void check_peft_adapter_config(const std::string& json_text, const LoraOptions& lora, const std::string& flag,
                               const std::string& dir);

}  // namespace qtrain
