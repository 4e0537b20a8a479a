#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"
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
    QT_CHECK(std::isfinite(lora.alpha) && lora.alpha > 0, "--lora-alpha must be a positive number, got ", lora.alpha);
    QT_CHECK(lora.dropout == 0.0f, "--lora-dropout=", lora.dropout, " is not yet implemented (only 0)");
    QT_CHECK(lora.init == "kaiming" || lora.init == "gaussian", "--lora-init: expected kaiming or gaussian, got '",
             lora.init, "'");
    QT_CHECK(lora.targets != 0 && lora.targets < (1u << kLoraTargets), "--lora-targets: no target selected");
    for (int t = 0; t < kLoraTargets; ++t) {
        const auto target = static_cast<LoraTarget>(t);
        if (!lora.has(target)) continue;
        const auto [out, in] = lora_target_shape(cfg, target);
        QT_CHECK(lora.rank <= std::min(out, in), "--lora-rank=", lora.rank, " is larger than ", kModule[t],
                 "'s dimensions [", out, ", ", in, "] (a rank above min(out, in) adds nothing a full matrix lacks)");
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

}  // namespace qtrain
