#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/flag_names.h"
#include "core/rng.h"

namespace qtrain {

namespace {

constexpr const char* kShort[kLoraTargets] = {"q", "k", "v", "o", "gate", "up", "down"};
constexpr const char* kModule[kLoraTargets] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
constexpr const char* kPath[kLoraTargets] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                             "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                             "mlp.down_proj"};

}  // namespace

const char* lora_target_name(LoraTarget t) { return kShort[static_cast<int>(t)]; }
const char* lora_module_name(LoraTarget t) { return kModule[static_cast<int>(t)]; }
const char* lora_module_path(LoraTarget t) { return kPath[static_cast<int>(t)]; }

uint32_t parse_lora_targets(const std::string& text, const std::string& flag) {
    if (text == "all") return (1u << kLoraTargets) - 1;
    uint32_t mask = 0;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) {
        int found = -1;
        for (int t = 0; t < kLoraTargets; ++t)
            if (item == kShort[t]) found = t;
        QT_CHECK(found >= 0, flag, "=", text, ": unknown target '", item, "' (expected all, or any of q,k,v,o,gate,up,down, "
                 "comma-separated)");
        mask |= 1u << found;
    }
    QT_CHECK(mask != 0, flag, "='", text, "' names no target (expected all, or any of q,k,v,o,gate,up,down)");
    return mask;
}

std::string lora_targets_text(uint32_t targets) {
    std::string out;
    for (int t = 0; t < kLoraTargets; ++t)
        if ((targets >> t) & 1u) out += (out.empty() ? "" : ",") + std::string(kShort[t]);
    return out;
}

uint32_t parse_lora_train_also(const std::string& text, const std::string& flag) {
    if (text.empty() || text == "none") return 0;
    uint32_t mask = 0;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) {
        QT_CHECK(item == "norms" || item == "embeddings", flag, "=", text, ": unknown entry '", item,
                 "' (expected norms, embeddings or both, comma-separated)");
        mask |= item == "norms" ? kTrainNorms : kTrainEmbeddings;
    }
    return mask;
}

std::string lora_train_also_text(uint32_t train_also) {
    std::string out = (train_also & kTrainNorms) ? "norms" : "";
    if (train_also & kTrainEmbeddings) out += out.empty() ? "embeddings" : ",embeddings";
    return out;
}

std::vector<ParamSpec> lora_train_also_base(const ModelConfig& cfg, const LoraOptions& lora) {
    std::vector<ParamSpec> out;
    if (!lora.enabled() || lora.train_also == 0) return out;
    for (const ParamSpec& s : model_parameters(cfg)) {
        const bool embedding = s.name == "model.embed_tokens.weight" || s.name == "lm_head.weight";
        if ((s.kind == ParamKind::Norm && (lora.train_also & kTrainNorms)) ||
            (embedding && (lora.train_also & kTrainEmbeddings)))
            out.push_back(s);
    }
    return out;
}

std::vector<ParamSpec> lora_train_also_parameters(const ModelConfig& cfg, const LoraOptions& lora) {
    std::vector<ParamSpec> out = lora_train_also_base(cfg, lora);
    for (ParamSpec& s : out) s.name = kPeftPrefix + s.name;
    return out;
}

std::array<int64_t, 2> lora_target_shape(const ModelConfig& c, LoraTarget t) {
    const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), i = c.intermediate_size;
    switch (t) {
        case LoraTarget::Q: return {q, h};
        case LoraTarget::K: return {kv, h};
        case LoraTarget::V: return {kv, h};
        case LoraTarget::O: return {h, q};
        case LoraTarget::Gate: return {i, h};
        case LoraTarget::Up: return {i, h};
        case LoraTarget::Down: return {h, i};
    }
    return {0, 0};
}

void check_lora(const ModelConfig& cfg, const LoraOptions& lora) {
    if (!lora.enabled()) return;
    QT_CHECK(std::isfinite(lora.alpha) && lora.alpha > 0, flag(&LoraOptions::alpha), " must be a positive number, got ",
             lora.alpha);
    QT_CHECK(lora.dropout >= 0.0f && lora.dropout < 1.0f, flag(&LoraOptions::dropout), " must be in [0, 1), got ",
             lora.dropout);
    QT_CHECK(lora.init == "kaiming" || lora.init == "gaussian", flag(&LoraOptions::init),
             ": expected kaiming or gaussian, got '", lora.init, "'");
    QT_CHECK(lora.targets != 0 && lora.targets < (1u << kLoraTargets), flag(&LoraOptions::targets),
             ": no target selected");
    for (int t = 0; t < kLoraTargets; ++t) {
        const auto target = static_cast<LoraTarget>(t);
        if (!lora.has(target)) continue;
        const auto [out, in] = lora_target_shape(cfg, target);
        QT_CHECK(lora.rank <= std::min(out, in), flag(&LoraOptions::rank), "=", lora.rank, " is larger than ",
                 kModule[t], "'s dimensions [", out, ", ", in,
                 "] (a rank above min(out, in) adds nothing a full matrix lacks)");
    }
}

std::string lora_tensor_name(int layer, LoraTarget t, const char* which) {
    return "base_model.model.model.layers." + std::to_string(layer) + "." + kPath[static_cast<int>(t)] + "." + which +
           ".weight";
}

std::vector<ParamSpec> lora_parameters(const ModelConfig& cfg, const LoraOptions& lora) {
    std::vector<ParamSpec> p;
    if (!lora.enabled()) return p;
    const int64_t r = lora.rank;
    for (int l = 0; l < cfg.num_hidden_layers; ++l)
        for (int t = 0; t < kLoraTargets; ++t) {
            const auto target = static_cast<LoraTarget>(t);
            if (!lora.has(target)) continue;
            const auto [out, in] = lora_target_shape(cfg, target);
            p.push_back({lora_tensor_name(l, target, "lora_A"), {r, in}, ParamKind::Matrix, l});
            p.push_back({lora_tensor_name(l, target, "lora_B"), {out, r}, ParamKind::Matrix, l});
        }
    return p;
}

void init_lora_parameter(const ParamSpec& spec, const LoraOptions& lora, uint64_t seed, float* out) {
    const int64_t n = spec.numel();
    const bool is_b = spec.name.find(".lora_B.") != std::string::npos;
    if (is_b) {
        for (int64_t k = 0; k < n; ++k) out[k] = 0.0f;
        return;
    }
    uint64_t state = seed ^ hash_string(spec.name);
    Rng rng(splitmix64(state));
    if (lora.init == "gaussian") {
        const float std = 1.0f / static_cast<float>(lora.rank);
        for (int64_t k = 0; k < n; ++k) out[k] = std * rng.normal();
        return;
    }
    // kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound = gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in)
    const float bound = 1.0f / std::sqrt(static_cast<float>(spec.shape[1]));
    for (int64_t k = 0; k < n; ++k) out[k] = bound * (2.0f * rng.uniform() - 1.0f);
}

namespace {

// modules_to_save as PEFT matches them (by the module name's suffix) for --train-also
std::vector<std::string> modules_to_save(const LoraOptions& lora, const ModelConfig& cfg) {
    std::vector<std::string> m;
    if (lora.train_also & kTrainNorms) {
        m = {"input_layernorm", "post_attention_layernorm", "norm"};
        if (cfg.qk_norm) m.insert(m.end(), {"q_norm", "k_norm"});
    }
    if (lora.train_also & kTrainEmbeddings) {
        m.push_back("embed_tokens");
        if (!cfg.tie_word_embeddings) m.push_back("lm_head");
    }
    return m;
}

}  // namespace

std::string peft_adapter_config_json(const LoraOptions& lora, const ModelConfig& cfg) {
    nlohmann::json j;
    j["peft_type"] = "LORA";
    j["task_type"] = "CAUSAL_LM";
    j["base_model_name_or_path"] = lora.base_model;
    j["r"] = lora.rank;
    // an integral alpha as PEFT's int default writes it (8, not 8.0)
    if (lora.alpha == std::floor(lora.alpha)) j["lora_alpha"] = static_cast<int64_t>(lora.alpha);
    else j["lora_alpha"] = lora.alpha;
    j["lora_dropout"] = lora.dropout;
    nlohmann::json targets = nlohmann::json::array();
    for (int t = 0; t < kLoraTargets; ++t)
        if (lora.has(static_cast<LoraTarget>(t))) targets.push_back(kModule[t]);
    j["target_modules"] = targets;
    j["bias"] = "none";
    j["fan_in_fan_out"] = false;
    j["inference_mode"] = true;
    j["init_lora_weights"] = lora.init == "gaussian" ? nlohmann::json("gaussian") : nlohmann::json(true);
    j["use_rslora"] = false;
    j["use_dora"] = false;
    const std::vector<std::string> saved = modules_to_save(lora, cfg);
    j["modules_to_save"] = saved.empty() ? nlohmann::json(nullptr) : nlohmann::json(saved);
    // a tied model trains one matrix: PEFT ties the LM head to the trained embedding copy
    if ((lora.train_also & kTrainEmbeddings) && cfg.tie_word_embeddings) j["ensure_weight_tying"] = true;
    j["layers_to_transform"] = nullptr;
    j["layers_pattern"] = nullptr;
    j["rank_pattern"] = nlohmann::json::object();
    j["alpha_pattern"] = nlohmann::json::object();
    j["revision"] = nullptr;
    return j.dump(2) + "\n";
}

void check_peft_adapter_config(const std::string& text, const LoraOptions& lora, const std::string& flag,
                               const std::string& dir) {
    const std::string where = flag + "=" + dir;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
        throw_error(cat(where, ": ", kAdapterConfigFile, " is not JSON: ", e.what()));
    }
    QT_CHECK(j.value("peft_type", std::string()) == "LORA", where, ": not a LoRA adapter (peft_type '",
             j.value("peft_type", std::string()), "')");
    const int r = j.value("r", -1);
    QT_CHECK(r == lora.rank, where, ": the adapter has rank r=", r, ", this run ", qtrain::flag(&LoraOptions::rank),
             "=", lora.rank, " (give ", qtrain::flag(&LoraOptions::rank), "=", r, ")");
    const double alpha = j.value("lora_alpha", -1.0);
    QT_CHECK(static_cast<float>(alpha) == lora.alpha, where, ": the adapter has lora_alpha=", alpha, ", this run ",
             qtrain::flag(&LoraOptions::alpha), "=", lora.alpha, " (give ", qtrain::flag(&LoraOptions::alpha), "=",
             alpha, ")");
    QT_CHECK(!j.value("use_dora", false) && !j.value("use_rslora", false), where,
             ": DoRA and rsLoRA adapters are not supported (use_dora / use_rslora)");
    QT_CHECK(j.contains("target_modules") && j["target_modules"].is_array(), where,
             ": target_modules must be a list of module names (q_proj, ..., down_proj)");
    uint32_t mask = 0;
    for (const auto& m : j["target_modules"]) {
        const std::string name = m.is_string() ? m.get<std::string>() : m.dump();
        int found = -1;
        for (int t = 0; t < kLoraTargets; ++t)
            if (name == kModule[t]) found = t;
        QT_CHECK(found >= 0, where, ": target module '", name, "' is not one of q_proj, k_proj, v_proj, o_proj, "
                 "gate_proj, up_proj, down_proj");
        mask |= 1u << found;
    }
    QT_CHECK(mask == lora.targets, where, ": the adapter targets ", lora_targets_text(mask), ", this run ",
             qtrain::flag(&LoraOptions::targets), "=", lora_targets_text(lora.targets), " (give ",
             qtrain::flag(&LoraOptions::targets), "=", lora_targets_text(mask), ")");
    // modules_to_save: what --train-also the adapter was trained with (PEFT's names, matched by suffix)
    uint32_t also = 0;
    if (j.contains("modules_to_save") && j["modules_to_save"].is_array())
        for (const auto& m : j["modules_to_save"]) {
            const std::string name = m.is_string() ? m.get<std::string>() : m.dump();
            const bool embedding = name == "embed_tokens" || name == "lm_head";
            QT_CHECK(embedding || (name.size() >= 4 && name.compare(name.size() - 4, 4, "norm") == 0), where,
                     ": modules_to_save entry '", name, "' is not a norm, embed_tokens or lm_head (what ",
                     qtrain::flag(&LoraOptions::train_also), " trains)");
            also |= embedding ? kTrainEmbeddings : kTrainNorms;
        }
    QT_CHECK(also == lora.train_also, where, ": the adapter also trains '", lora_train_also_text(also),
             "' (modules_to_save), this run ", qtrain::flag(&LoraOptions::train_also), "='",
             lora_train_also_text(lora.train_also), "' (give ", qtrain::flag(&LoraOptions::train_also), "=",
             also ? lora_train_also_text(also) : "none", ")");
}

}  // namespace qtrain
