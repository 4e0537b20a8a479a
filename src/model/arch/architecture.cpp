#include "model/arch/architecture.h"

#include "core/error.h"
#include "model/model_config.h"

namespace qtrain {

// Facts from transformers' modeling and configuration files of each family (4.x and 5.x agree):
// Qwen2Attention: q/k/v Linear(bias=True), o_proj bias=False; Qwen3Attention and LlamaAttention:
// every projection bias=config.attention_bias; LlamaMLP: bias=config.mlp_bias (Qwen2/Qwen3 MLPs have
// none); Qwen3Attention: q_norm/k_norm = Qwen3RMSNorm(head_dim) before RoPE; head_dim: Qwen3Config
// defaults to 128, LlamaConfig to hidden_size // num_attention_heads.
const std::vector<Architecture>& architectures() {
    static const std::vector<Architecture> kAll = {
        {"Qwen2ForCausalLM", "qwen2", true, false, false, false, false, 0, true, false, 32768},
        {"Qwen3ForCausalLM", "qwen3", false, true, false, true, true, 128, true, false, 32768},
        {"LlamaForCausalLM", "llama", false, true, true, false, true, 0, false, true, 2048},
    };
    return kAll;
}

const Architecture* find_architecture(const std::string& hf_class, const std::string& model_type) {
    for (const Architecture& a : architectures())
        if (hf_class.empty() ? model_type == a.model_type : hf_class == a.hf_class) return &a;
    return nullptr;
}

const Architecture& architecture_of(const ModelConfig& cfg) {
    const Architecture* a = find_architecture(cfg.architecture, cfg.model_type);
    QT_CHECK(a != nullptr, "unsupported architecture '", cfg.architecture, "' (qtrain trains ",
             supported_architectures_text(), ")");
    return *a;
}

std::string supported_architectures_text() {
    std::string s;
    for (const Architecture& a : architectures())
        s += cat(s.empty() ? "" : ", ", a.hf_class, " (model_type ", a.model_type, ")");
    return s;
}

}  // namespace qtrain
