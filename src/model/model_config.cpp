#include "model/model_config.h"

#include <climits>
#include <cstdint>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"

namespace qtrain {

using json = nlohmann::json;

int64_t ModelConfig::num_parameters() const {
    int64_t h = hidden_size, i = intermediate_size, v = vocab_size;
    int64_t per_layer = h * q_dim() + q_dim()            // q_proj + bias
                        + 2 * (h * kv_dim() + kv_dim())  // k_proj, v_proj + biases
                        + q_dim() * h                    // o_proj
                        + 3 * h * i                      // gate, up, down
                        + 2 * h;                         // two RMSNorms
    return v * h * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * per_layer + h;
}

void ModelConfig::validate(const std::string& source) const {
    auto positive = [&](int v, const char* name) {
        QT_CHECK(v > 0, source, ": '", name, "' must be a positive integer, got ", v);
    };
    positive(vocab_size, "vocab_size");
    positive(hidden_size, "hidden_size");
    positive(intermediate_size, "intermediate_size");
    positive(num_hidden_layers, "num_hidden_layers");
    positive(num_attention_heads, "num_attention_heads");
    positive(num_key_value_heads, "num_key_value_heads");
    positive(head_dim, "head_dim");
    QT_CHECK(num_attention_heads % num_key_value_heads == 0, source, ": num_attention_heads (", num_attention_heads,
             ") must be a multiple of num_key_value_heads (", num_key_value_heads, ")");
    QT_CHECK(head_dim % 2 == 0, source, ": head_dim must be even for RoPE, got ", head_dim);
    QT_CHECK(rms_norm_eps > 0, source, ": rms_norm_eps must be positive, got ", rms_norm_eps);
    QT_CHECK(rope_theta > 0, source, ": rope_theta must be positive, got ", rope_theta);
    QT_CHECK(hidden_act == "silu", source, ": hidden_act '", hidden_act, "' is not supported (expected silu)");
}

// nlohmann's get<int>() quietly accepts booleans and truncates 896.5 or 1e12; a config.json with
// such a value is wrong, so each type is checked strictly and the message says what was found.
template <class T>
static T convert_field(const json& v, const std::string& key, const std::string& source) {
    auto wrong = [&](const char* expected) {
        throw_error(cat(source, ": field '", key, "' has the wrong type (expected ", expected, ", got ",
                        v.type_name(), " ", v.dump(), ")"));
    };
    if constexpr (std::is_same_v<T, bool>) {
        if (!v.is_boolean()) wrong("true or false");
        return v.get<bool>();
    } else if constexpr (std::is_same_v<T, int>) {
        if (!v.is_number_integer()) wrong("an integer");
        const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                              ? INT64_MAX
                              : v.get<int64_t>();
        QT_CHECK(x >= INT32_MIN && x <= INT32_MAX, source, ": field '", key, "' = ", v.dump(),
                 " does not fit in a 32-bit integer");
        return static_cast<int>(x);
    } else if constexpr (std::is_same_v<T, double>) {
        if (!v.is_number()) wrong("a number");
        return v.get<double>();
    } else {
        static_assert(std::is_same_v<T, std::string>);
        if (!v.is_string()) wrong("a string");
        return v.get<std::string>();
    }
}

template <class T>
static T get_or(const json& j, const char* key, T fallback, const std::string& source) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    return convert_field<T>(*it, key, source);
}

template <class T>
static T get_required(const json& j, const char* key, const std::string& source) {
    QT_CHECK(j.contains(key) && !j[key].is_null(), source, ": missing required field '", key, "'");
    return get_or<T>(j, key, T{}, source);
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
    json j;
    try {
        j = json::parse(json_text);
    } catch (const json::parse_error& e) {
        throw_error(cat(source, ": not valid JSON (", e.what(), ")"));
    }
    QT_CHECK(j.is_object(), source, ": expected a JSON object at the top level");

    ModelConfig c;
    std::string arch;
    if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
        arch = j["architectures"][0].is_string() ? j["architectures"][0].get<std::string>() : "";
    }
    std::string model_type = get_or<std::string>(j, "model_type", "", source);
    QT_CHECK(arch == "Qwen2ForCausalLM" || (arch.empty() && model_type == "qwen2"), source,
             ": unsupported architecture '", arch.empty() ? model_type : arch,
             "' (qtrain trains Qwen2ForCausalLM / model_type qwen2 models, e.g. Qwen2.5)");
    c.architecture = "Qwen2ForCausalLM";
    c.model_type = "qwen2";

    c.vocab_size = get_required<int>(j, "vocab_size", source);
    c.hidden_size = get_required<int>(j, "hidden_size", source);
    c.intermediate_size = get_required<int>(j, "intermediate_size", source);
    c.num_hidden_layers = get_required<int>(j, "num_hidden_layers", source);
    c.num_attention_heads = get_required<int>(j, "num_attention_heads", source);
    c.num_key_value_heads = get_or<int>(j, "num_key_value_heads", c.num_attention_heads, source);
    QT_CHECK(c.num_attention_heads > 0, source, ": 'num_attention_heads' must be positive, got ", c.num_attention_heads);
    c.head_dim = get_or<int>(j, "head_dim", c.hidden_size / c.num_attention_heads, source);
    QT_CHECK(c.head_dim * c.num_attention_heads == c.hidden_size, source, ": head_dim (", c.head_dim,
             ") * num_attention_heads (", c.num_attention_heads, ") must equal hidden_size (", c.hidden_size,
             ") for Qwen2");
    c.max_position_embeddings = get_or<int>(j, "max_position_embeddings", 32768, source);
    c.rope_theta = get_or<double>(j, "rope_theta", 10000.0, source);
    c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6, source);
    c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false, source);
    c.bos_token_id = get_or<int>(j, "bos_token_id", 151643, source);
    if (j.contains("eos_token_id") && j["eos_token_id"].is_array()) {
        QT_CHECK(!j["eos_token_id"].empty(), source, ": 'eos_token_id' is an empty list");
        c.eos_token_id = convert_field<int>(j["eos_token_id"][0], "eos_token_id[0]", source);
    } else {
        c.eos_token_id = get_or<int>(j, "eos_token_id", 151643, source);
    }
    c.use_sliding_window = get_or<bool>(j, "use_sliding_window", false, source);
    c.sliding_window = get_or<int>(j, "sliding_window", 0, source);
    c.max_window_layers = get_or<int>(j, "max_window_layers", c.num_hidden_layers, source);
    c.hidden_act = get_or<std::string>(j, "hidden_act", "silu", source);
    c.initializer_range = get_or<double>(j, "initializer_range", 0.02, source);
    c.torch_dtype = get_or<std::string>(j, "torch_dtype", get_or<std::string>(j, "dtype", "bfloat16", source), source);
    c.attention_dropout = get_or<double>(j, "attention_dropout", 0.0, source);

    QT_CHECK(!c.use_sliding_window, source, ": use_sliding_window=true is not supported (Qwen2.5 models have it off)");
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
        const json& rs = j["rope_scaling"];
        std::string type = "?";
        for (const char* key : {"type", "rope_type"})  // rope_type (newer) wins over type
            if (rs.is_object() && rs.contains(key) && rs[key].is_string()) type = rs[key].get<std::string>();
        QT_CHECK(type == "default", source, ": rope_scaling of type '", type, "' is not supported (only plain RoPE)");
    }
    QT_CHECK(c.attention_dropout == 0.0, source, ": attention_dropout must be 0 (dropout is not implemented), got ",
             c.attention_dropout);
    c.validate(source);
    return c;
}

ModelConfig load_model_config(const std::string& path) { return parse_model_config(read_text_file(path), path); }

std::string model_config_to_json(const ModelConfig& c) {
    json j;
    j["architectures"] = {c.architecture};
    j["model_type"] = c.model_type;
    j["attention_dropout"] = c.attention_dropout;
    j["bos_token_id"] = c.bos_token_id;
    j["eos_token_id"] = c.eos_token_id;
    j["hidden_act"] = c.hidden_act;
    j["hidden_size"] = c.hidden_size;
    j["initializer_range"] = c.initializer_range;
    j["intermediate_size"] = c.intermediate_size;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["max_window_layers"] = c.max_window_layers;
    j["num_attention_heads"] = c.num_attention_heads;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_key_value_heads"] = c.num_key_value_heads;
    j["rms_norm_eps"] = c.rms_norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["sliding_window"] = c.sliding_window;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["torch_dtype"] = c.torch_dtype;
    j["use_cache"] = true;
    j["use_sliding_window"] = c.use_sliding_window;
    j["vocab_size"] = c.vocab_size;
    return j.dump(2) + "\n";
}

// Published shapes of the Qwen2.5 base models (huggingface.co/Qwen/Qwen2.5-*/config.json).
struct Preset {
    const char* name;
    int hidden, intermediate, layers, heads, kv_heads, vocab, max_pos;
    bool tied;
    double eps;
};
static constexpr Preset kPresets[] = {
    {"Qwen2.5-0.5B", 896, 4864, 24, 14, 2, 151936, 32768, true, 1e-6},
    {"Qwen2.5-1.5B", 1536, 8960, 28, 12, 2, 151936, 131072, true, 1e-6},
    {"Qwen2.5-3B", 2048, 11008, 36, 16, 2, 151936, 32768, true, 1e-6},
    {"Qwen2.5-7B", 3584, 18944, 28, 28, 4, 152064, 131072, false, 1e-6},
    {"Qwen2.5-14B", 5120, 13824, 48, 40, 8, 152064, 131072, false, 1e-5},
    {"Qwen2.5-32B", 5120, 27648, 64, 40, 8, 152064, 131072, false, 1e-5},
};

static std::string strip_org(const std::string& name) {
    auto slash = name.rfind('/');
    return slash == std::string::npos ? name : name.substr(slash + 1);
}

bool has_preset(const std::string& name) {
    std::string bare = strip_org(name);
    for (const auto& p : kPresets)
        if (bare == p.name) return true;
    return false;
}

std::vector<std::string> preset_names() {
    std::vector<std::string> names;
    for (const auto& p : kPresets) names.emplace_back(p.name);
    return names;
}

ModelConfig preset_config(const std::string& name) {
    std::string bare = strip_org(name);
    for (const auto& p : kPresets) {
        if (bare != p.name) continue;
        ModelConfig c;
        c.hidden_size = p.hidden;
        c.intermediate_size = p.intermediate;
        c.num_hidden_layers = p.layers;
        c.num_attention_heads = p.heads;
        c.num_key_value_heads = p.kv_heads;
        c.head_dim = p.hidden / p.heads;
        c.vocab_size = p.vocab;
        c.max_position_embeddings = p.max_pos;
        c.tie_word_embeddings = p.tied;
        c.rms_norm_eps = p.eps;
        c.rope_theta = 1000000.0;
        c.sliding_window = p.max_pos;
        c.max_window_layers = p.layers;
        c.validate(std::string("preset ") + p.name);
        return c;
    }
    std::string all;
    for (const auto& p : kPresets) all += std::string(all.empty() ? "" : ", ") + p.name;
    throw_error(cat("unknown model preset '", name, "' (built-in presets: ", all, ")"));
}

}  // namespace qtrain
