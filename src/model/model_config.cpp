#include "model/model_config.h"

#include <climits>
#include <cstdint>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "model/arch/architecture.h"
#include "model/parameters.h"

namespace qtrain {

using json = nlohmann::json;

int64_t ModelConfig::num_parameters() const {
    int64_t n = 0;
    for (const ParamSpec& p : model_parameters(*this)) n += p.numel();
    return n;
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
    QT_CHECK(pad_token_id < vocab_size, source, ": pad_token_id ", pad_token_id, " is outside the vocabulary (",
             vocab_size, " tokens); transformers' nn.Embedding refuses such a padding_idx too");
    QT_CHECK(hidden_act == "silu", source, ": hidden_act '", hidden_act, "' is not supported (expected silu)");
    QT_CHECK(rope_type == "default" || rope_type == "llama3", source, ": rope_type '", rope_type,
             "' is not supported (default or llama3)");
    if (rope_type == "llama3") {
        QT_CHECK(rope_factor > 0, source, ": the llama3 RoPE 'factor' must be positive, got ", rope_factor);
        QT_CHECK(rope_low_freq_factor > 0 && rope_high_freq_factor > rope_low_freq_factor, source,
                 ": the llama3 RoPE needs 0 < low_freq_factor < high_freq_factor, got ", rope_low_freq_factor, " and ",
                 rope_high_freq_factor);
        QT_CHECK(rope_original_max_position_embeddings > 0, source,
                 ": the llama3 RoPE 'original_max_position_embeddings' must be positive, got ",
                 rope_original_max_position_embeddings);
    }
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

// A number as config.json writes it (1000000.0, 1e-05), for messages.
static std::string num(double v) { return json(v).dump(); }

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

// A field that, when present, must hold its neutral value: transformers' Qwen2 code reads it and a
// different value changes the model, which qtrain does not implement.
static void check_neutral_number(const json& j, const std::string& key, const std::string& where, double neutral,
                                 const std::string& source, const char* why) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    const double v = convert_field<double>(*it, where, source);
    QT_CHECK(v == neutral, source, ": '", where, "' = ", it->dump(), " is not supported (expected ", num(neutral), "; ",
             why, ")");
}

// One RoPE dict, `rope_parameters` (transformers 5) or `rope_scaling` (4.x): `dict` null when the
// field is null or absent. It must be one flat dict for all layers, of a RoPE type qtrain implements.
struct RopeDict {
    const json* dict = nullptr;
    std::string type = "default";  // its rope_type ("type" in old files), "default" when it names none
    std::string type_field;        // where the type was written, for messages
};

static bool implemented_rope_type(const std::string& t) { return t == "default" || t == "llama3"; }

static RopeDict rope_dict(const json& j, const char* key, const std::string& source) {
    RopeDict r;
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return r;
    QT_CHECK(it->is_object(), source, ": field '", key, "' has the wrong type (expected an object such as ",
             "{\"rope_type\": \"default\", \"rope_theta\": 1000000.0}, got ", it->dump(), ")");
    for (const auto& [k, v] : it->items()) {
        // transformers 5 also accepts one dict per layer type (Gemma 3 style); its Qwen2, Qwen3 and Llama
        // models index rope_parameters["rope_type"] and so cannot build from that form.
        QT_CHECK(!v.is_object() && k != "full_attention" && k != "sliding_attention", source, ": '", key, ".", k,
                 "': RoPE parameters per layer type are not supported (transformers reads one dict ",
                 "{\"rope_type\": ..., \"rope_theta\": ...} for all layers of these models)");
    }
    r.dict = &*it;
    // 4.x lets "type" win over "rope_type", 5.x the reverse: each one present must name the same
    // implemented type.
    for (const char* t : {"type", "rope_type"}) {
        if (!it->contains(t) || (*it)[t].is_null()) continue;
        const std::string where = cat(key, ".", t);
        const std::string type = convert_field<std::string>((*it)[t], where, source);
        QT_CHECK(implemented_rope_type(type), source, ": '", where, "' = '", type, "' is not supported (qtrain ",
                 "implements rope_type 'default' (plain RoPE) and 'llama3'; linear, dynamic, yarn, longrope, mrope... ",
                 "scale or split the frequencies otherwise)");
        QT_CHECK(r.type_field.empty() || r.type == type, source, ": '", r.type_field, "' = '", r.type, "' and '",
                 where, "' = '", type, "' disagree (transformers 4.x reads 'type' first, 5.x 'rope_type')");
        r.type = type;
        r.type_field = where;
    }
    check_neutral_number(*it, "partial_rotary_factor", cat(key, ".partial_rotary_factor"), 1.0, source,
                         "qtrain rotates the whole head");
    return r;
}

// The RoPE type and the llama3 parameters. transformers 5 reads 'rope_scaling' when a file has one
// (it replaces 'rope_parameters'), else 'rope_parameters'; 4.x reads only 'rope_scaling'. Where a file
// has both, they must describe the same frequencies.
static void parse_rope_type(const json& j, ModelConfig& c, const std::string& source) {
    const RopeDict params = rope_dict(j, "rope_parameters", source);
    const RopeDict scaling = rope_dict(j, "rope_scaling", source);
    const bool scaling_wins = scaling.dict && !scaling.dict->empty();
    const RopeDict& used = scaling_wins ? scaling : params;
    const char* used_key = scaling_wins ? "rope_scaling" : "rope_parameters";
    c.rope_type = used.dict ? used.type : "default";
    if (scaling_wins && params.dict)
        QT_CHECK(params.type == scaling.type, source, ": 'rope_parameters' (rope_type '", params.type,
                 "') and 'rope_scaling' (rope_type '", scaling.type, "') disagree; transformers 5 uses 'rope_scaling', ",
                 "make them describe the same RoPE");
    if (c.rope_type != "llama3") return;
    auto number = [&](const char* field) {
        const std::string where = cat(used_key, ".", field);
        QT_CHECK(used.dict->contains(field) && !(*used.dict)[field].is_null(), source, ": missing '", where,
                 "' (the llama3 RoPE needs factor, low_freq_factor, high_freq_factor and ",
                 "original_max_position_embeddings)");
        const double v = convert_field<double>((*used.dict)[field], where, source);
        if (scaling_wins && params.dict && params.dict->contains(field) && !(*params.dict)[field].is_null()) {
            const std::string other = cat("rope_parameters.", field);
            const double w = convert_field<double>((*params.dict)[field], other, source);
            QT_CHECK(v == w, source, ": '", other, "' = ", num(w), " disagrees with '", where, "' = ", num(v),
                     ", which transformers 5 uses; make them equal");
        }
        return v;
    };
    c.rope_factor = number("factor");
    c.rope_low_freq_factor = number("low_freq_factor");
    c.rope_high_freq_factor = number("high_freq_factor");
    const double original = number("original_max_position_embeddings");
    QT_CHECK(original == static_cast<double>(static_cast<int>(original)) && original > 0, source, ": '", used_key,
             ".original_max_position_embeddings' must be a positive integer, got ", num(original));
    c.rope_original_max_position_embeddings = static_cast<int>(original);
}

// The RoPE base. transformers 4.x reads the top-level 'rope_theta' (default 10000) and ignores
// 'rope_parameters'; 5.x reads 'rope_parameters' (or 'rope_scaling' when a file has one: it replaces
// rope_parameters), falling back to the top-level 'rope_theta', then 10000. qtrain takes 5.x's value
// and refuses a file in which the forms disagree, since one of the two libraries would then build
// another model. A 5.x file without the top-level key is fine (4.x cannot read it at all).
static double parse_rope_theta(const json& j, const std::string& source) {
    const json* params = rope_dict(j, "rope_parameters", source).dict;
    const json* scaling = rope_dict(j, "rope_scaling", source).dict;
    check_neutral_number(j, "partial_rotary_factor", "partial_rotary_factor", 1.0, source,
                         "qtrain rotates the whole head");

    std::vector<std::pair<std::string, double>> given;  // every base the file writes, by field
    if (j.contains("rope_theta") && !j["rope_theta"].is_null())
        given.emplace_back("rope_theta", convert_field<double>(j["rope_theta"], "rope_theta", source));
    for (auto [d, name] : {std::pair{params, "rope_parameters"}, std::pair{scaling, "rope_scaling"}}) {
        if (d && d->contains("rope_theta") && !(*d)["rope_theta"].is_null()) {
            const std::string where = cat(name, ".rope_theta");
            given.emplace_back(where, convert_field<double>((*d)["rope_theta"], where, source));
        }
    }

    auto find = [&](const std::string& where) -> const std::pair<std::string, double>* {
        for (const auto& g : given)
            if (g.first == where) return &g;
        return nullptr;
    };
    const bool scaling_wins = scaling && !scaling->empty();
    const auto* used = find(scaling_wins ? "rope_scaling.rope_theta" : "rope_parameters.rope_theta");
    if (!used) used = find("rope_theta");
    const double theta = used ? used->second : 10000.0;  // Qwen2Config's default in 4.x and 5.x
    const std::string used_text = used ? cat("'", used->first, "' = ", num(theta)) : cat("the default ", num(theta));
    for (const auto& [where, value] : given)
        QT_CHECK(value == theta, source, ": '", where, "' = ", num(value), " disagrees with ", used_text,
                 ", which transformers 5 uses (",
                 scaling_wins && params ? "its 'rope_scaling' replaces 'rope_parameters'; " : "",
                 "transformers 4.x reads only the top-level 'rope_theta'); make them equal");
    // Without rope_parameters this is a 4.x file; a base only inside rope_scaling is one 4.x ignores.
    QT_CHECK(params || find("rope_theta") || theta == 10000.0, source, ": 'rope_scaling.rope_theta' = ", num(theta),
             " without a top-level 'rope_theta': transformers 4.x ignores it (and uses 10000.0), 5.x uses it; "
             "add \"rope_theta\": ", num(theta));
    return theta;
}

// Attention layout: transformers' Qwen2 gives a layer sliding-window attention when its layer_types
// entry says so (4.x/5.x derive layer_types from use_sliding_window and max_window_layers when absent).
static void check_full_attention(const json& j, const ModelConfig& c, const std::string& source) {
    QT_CHECK(!c.use_sliding_window, source, ": 'use_sliding_window' = true is not supported (sliding-window ",
             "attention; qtrain implements full causal attention, as Qwen2.5 models use)");
    auto it = j.find("layer_types");
    if (it == j.end() || it->is_null()) return;
    QT_CHECK(it->is_array(), source, ": field 'layer_types' has the wrong type (expected a list of ",
             "\"full_attention\", got ", it->dump(), ")");
    QT_CHECK(static_cast<int>(it->size()) == c.num_hidden_layers, source, ": 'layer_types' has ", it->size(),
             " entries but num_hidden_layers is ", c.num_hidden_layers);
    for (size_t i = 0; i < it->size(); ++i) {
        const std::string where = cat("layer_types[", i, "]");
        const std::string type = convert_field<std::string>((*it)[i], where, source);
        QT_CHECK(type == "full_attention", source, ": '", where, "' = '", type, "' is not supported (qtrain ",
                 "implements full causal attention on every layer, layer type 'full_attention')");
    }
}

// Fields of transformers' generic config that change the model when set and that qtrain does not implement.
static void check_generic_fields(const json& j, const std::string& source) {
    auto set = [&](const char* key) {
        auto it = j.find(key);
        return it != j.end() && !it->is_null() && !(it->is_object() && it->empty()) && !(it->is_array() && it->empty());
    };
    QT_CHECK(!set("quantization_config"), source, ": 'quantization_config' is set (a quantized checkpoint, ",
             j.contains("quantization_config") ? j["quantization_config"].dump() : "", "); qtrain loads and trains ",
             "plain fp32/bf16/fp16 weights");
    QT_CHECK(!set("per_layer_config"), source, ": 'per_layer_config' is set (layers that differ from the global ",
             "config, transformers 5); qtrain builds every layer from the global fields");
    QT_CHECK(!set("pruned_heads"), source, ": 'pruned_heads' is set (transformers 4.x prunes attention heads at ",
             "load); qtrain implements whole layers only");
    QT_CHECK(!get_or<bool>(j, "torchscript", false, source), source, ": 'torchscript' = true is not supported ",
             "(transformers 4.x then clones the tied lm_head instead of sharing the embedding)");
}

// Token ids are optional in transformers (null when unset); qtrain keeps -1 for "none".
static int token_id(const json& j, const char* key, const std::string& source) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return -1;
    if (it->is_array()) {  // eos_token_id may be a list; the first one ends generation first
        QT_CHECK(!it->empty(), source, ": '", key, "' is an empty list");
        return convert_field<int>((*it)[0], cat(key, "[0]"), source);
    }
    return convert_field<int>(*it, key, source);
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
    const Architecture* family = find_architecture(arch, model_type);
    QT_CHECK(family != nullptr, source, ": unsupported architecture '", arch.empty() ? model_type : arch,
             "' (qtrain trains ", supported_architectures_text(), ")");
    // transformers builds the model of model_type's config class; a file whose two names disagree
    // means another model to one reader or the other
    QT_CHECK(model_type.empty() || model_type == family->model_type, source, ": 'architectures' says ", arch,
             " but 'model_type' = '", model_type, "' (expected '", family->model_type, "' for ", family->hf_class, ")");
    c.architecture = family->hf_class;
    c.model_type = family->model_type;

    c.vocab_size = get_required<int>(j, "vocab_size", source);
    c.hidden_size = get_required<int>(j, "hidden_size", source);
    c.intermediate_size = get_required<int>(j, "intermediate_size", source);
    c.num_hidden_layers = get_required<int>(j, "num_hidden_layers", source);
    c.num_attention_heads = get_required<int>(j, "num_attention_heads", source);
    c.num_key_value_heads = get_or<int>(j, "num_key_value_heads", c.num_attention_heads, source);
    QT_CHECK(c.num_attention_heads > 0, source, ": 'num_attention_heads' must be positive, got ", c.num_attention_heads);
    const int default_head_dim =
        family->default_head_dim > 0 ? family->default_head_dim : c.hidden_size / c.num_attention_heads;
    c.head_dim = get_or<int>(j, "head_dim", default_head_dim, source);
    if (!family->free_head_dim)
        QT_CHECK(c.head_dim * c.num_attention_heads == c.hidden_size, source, ": head_dim (", c.head_dim,
                 ") * num_attention_heads (", c.num_attention_heads, ") must equal hidden_size (", c.hidden_size,
                 ") for ", family->hf_class);
    else
        QT_CHECK(family->default_head_dim > 0 || j.contains("head_dim") ||
                     c.hidden_size % c.num_attention_heads == 0,
                 source, ": hidden_size (", c.hidden_size, ") is not a multiple of num_attention_heads (",
                 c.num_attention_heads, ") and the file gives no head_dim");
    c.max_position_embeddings =
        get_or<int>(j, "max_position_embeddings", family->default_max_position_embeddings, source);
    c.rope_theta = parse_rope_theta(j, source);
    parse_rope_type(j, c, source);
    c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6, source);
    c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false, source);
    c.bos_token_id = token_id(j, "bos_token_id", source);
    c.eos_token_id = token_id(j, "eos_token_id", source);
    c.pad_token_id = token_id(j, "pad_token_id", source);
    if (family->sliding_window_fields) {
        c.use_sliding_window = get_or<bool>(j, "use_sliding_window", false, source);
        c.sliding_window = get_or<int>(j, "sliding_window", 0, source);
        c.max_window_layers = get_or<int>(j, "max_window_layers", c.num_hidden_layers, source);
    }
    c.hidden_act = get_or<std::string>(j, "hidden_act", "silu", source);
    c.initializer_range = get_or<double>(j, "initializer_range", 0.02, source);
    // transformers 5 writes "dtype", older versions "torch_dtype"; both keep "dtype" when a file has both.
    c.torch_dtype = get_or<std::string>(j, "dtype", get_or<std::string>(j, "torch_dtype", "bfloat16", source), source);
    c.attention_dropout = get_or<double>(j, "attention_dropout", 0.0, source);

    // the block's optional steps
    const bool attention_bias = family->reads_attention_bias && get_or<bool>(j, "attention_bias", false, source);
    c.qkv_bias = family->fixed_qkv_bias || attention_bias;
    c.o_bias = attention_bias;
    c.mlp_bias = family->reads_mlp_bias && get_or<bool>(j, "mlp_bias", false, source);
    c.qk_norm = family->qk_norm;
    if (family->reads_pretraining_tp) {
        const int tp = get_or<int>(j, "pretraining_tp", 1, source);
        QT_CHECK(tp == 1, source, ": 'pretraining_tp' = ", tp, " is not supported (expected 1; transformers 4.x then ",
                 "splits every projection into ", tp, " slices)");
    }

    check_full_attention(j, c, source);
    check_generic_fields(j, source);
    QT_CHECK(c.attention_dropout == 0.0, source, ": attention_dropout must be 0 (dropout is not implemented), got ",
             c.attention_dropout);
    c.validate(source);
    return c;
}

ModelConfig load_model_config(const std::string& path) { return parse_model_config(read_text_file(path), path); }

// Written so that transformers 4.x and 5.x build the same model from it: 4.x reads the top-level
// 'rope_theta' and 'rope_scaling', 5.x 'rope_parameters' (or 'rope_scaling' when present: written
// with the same content), and 'layer_types' says full attention on every layer for the families that
// read it, as both versions write it themselves. Only the fields the family's config class has.
std::string model_config_to_json(const ModelConfig& c) {
    const Architecture& family = architecture_of(c);
    auto id = [](int v) { return v < 0 ? json(nullptr) : json(v); };
    json j;
    j["architectures"] = {c.architecture};
    j["model_type"] = c.model_type;
    j["attention_dropout"] = c.attention_dropout;
    j["bos_token_id"] = id(c.bos_token_id);
    j["eos_token_id"] = id(c.eos_token_id);
    if (c.pad_token_id >= 0) j["pad_token_id"] = c.pad_token_id;
    j["hidden_act"] = c.hidden_act;
    j["hidden_size"] = c.hidden_size;
    j["initializer_range"] = c.initializer_range;
    j["intermediate_size"] = c.intermediate_size;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["num_attention_heads"] = c.num_attention_heads;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_key_value_heads"] = c.num_key_value_heads;
    j["rms_norm_eps"] = c.rms_norm_eps;
    json rope = {{"rope_type", c.rope_type}, {"rope_theta", c.rope_theta}};
    if (c.rope_type == "llama3") {
        json scaling = {{"rope_type", "llama3"},
                        {"factor", c.rope_factor},
                        {"low_freq_factor", c.rope_low_freq_factor},
                        {"high_freq_factor", c.rope_high_freq_factor},
                        {"original_max_position_embeddings", c.rope_original_max_position_embeddings}};
        rope.update(scaling);
        scaling["rope_theta"] = c.rope_theta;  // 5.x replaces rope_parameters with it: the same dict
        j["rope_scaling"] = scaling;
    }
    j["rope_parameters"] = rope;
    j["rope_theta"] = c.rope_theta;
    if (family.sliding_window_fields) {
        j["layer_types"] = std::vector<std::string>(static_cast<size_t>(c.num_hidden_layers), "full_attention");
        j["max_window_layers"] = c.max_window_layers;
        j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
        j["use_sliding_window"] = c.use_sliding_window;
    }
    if (family.free_head_dim) j["head_dim"] = c.head_dim;
    if (family.reads_attention_bias) j["attention_bias"] = c.o_bias;
    if (family.reads_mlp_bias) j["mlp_bias"] = c.mlp_bias;
    if (family.reads_pretraining_tp) j["pretraining_tp"] = 1;
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["dtype"] = c.torch_dtype;
    j["torch_dtype"] = c.torch_dtype;  // transformers before 4.56 read only this name
    j["use_cache"] = true;
    j["vocab_size"] = c.vocab_size;
    return j.dump(2) + "\n";
}

// Published shapes (huggingface.co/<org>/<name>/config.json): the Qwen2.5 base models, the Qwen3
// models (the post-trained ones; the -Base models have the same shapes) and Meta's Llama 3.2 / 3.1 base
// models (llama3 RoPE: factor 32 for 3.2, 8 for 3.1; low 1, high 4, original 8192; theta 500000).
struct Preset {
    const char* name;
    const char* hf_class;
    int hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, max_pos;
    bool tied;
    double eps, theta, llama3_factor;  // llama3_factor 0: plain RoPE
    int bos, eos;
    bool window_is_max_pos;  // config.json's unused sliding_window: max_position_embeddings (Qwen2.5) or null
};
static constexpr Preset kPresets[] = {
    {"Qwen2.5-0.5B", "Qwen2ForCausalLM", 896, 4864, 24, 14, 2, 64, 151936, 32768, true, 1e-6, 1e6, 0, 151643, 151643, true},
    {"Qwen2.5-1.5B", "Qwen2ForCausalLM", 1536, 8960, 28, 12, 2, 128, 151936, 131072, true, 1e-6, 1e6, 0, 151643, 151643, true},
    {"Qwen2.5-3B", "Qwen2ForCausalLM", 2048, 11008, 36, 16, 2, 128, 151936, 32768, true, 1e-6, 1e6, 0, 151643, 151643, true},
    {"Qwen2.5-7B", "Qwen2ForCausalLM", 3584, 18944, 28, 28, 4, 128, 152064, 131072, false, 1e-6, 1e6, 0, 151643, 151643, true},
    {"Qwen2.5-14B", "Qwen2ForCausalLM", 5120, 13824, 48, 40, 8, 128, 152064, 131072, false, 1e-5, 1e6, 0, 151643, 151643, true},
    {"Qwen2.5-32B", "Qwen2ForCausalLM", 5120, 27648, 64, 40, 8, 128, 152064, 131072, false, 1e-5, 1e6, 0, 151643, 151643, true},
    {"Qwen3-0.6B", "Qwen3ForCausalLM", 1024, 3072, 28, 16, 8, 128, 151936, 40960, true, 1e-6, 1e6, 0, 151643, 151645, false},
    {"Qwen3-1.7B", "Qwen3ForCausalLM", 2048, 6144, 28, 16, 8, 128, 151936, 40960, true, 1e-6, 1e6, 0, 151643, 151645, false},
    {"Qwen3-4B", "Qwen3ForCausalLM", 2560, 9728, 36, 32, 8, 128, 151936, 40960, true, 1e-6, 1e6, 0, 151643, 151645, false},
    {"Qwen3-8B", "Qwen3ForCausalLM", 4096, 12288, 36, 32, 8, 128, 151936, 40960, false, 1e-6, 1e6, 0, 151643, 151645, false},
    {"Qwen3-14B", "Qwen3ForCausalLM", 5120, 17408, 40, 40, 8, 128, 151936, 40960, false, 1e-6, 1e6, 0, 151643, 151645, false},
    {"Qwen3-32B", "Qwen3ForCausalLM", 5120, 25600, 64, 64, 8, 128, 151936, 40960, false, 1e-6, 1e6, 0, 151643, 151645, false},
    {"Llama-3.2-1B", "LlamaForCausalLM", 2048, 8192, 16, 32, 8, 64, 128256, 131072, true, 1e-5, 5e5, 32, 128000, 128001, false},
    {"Llama-3.2-3B", "LlamaForCausalLM", 3072, 8192, 28, 24, 8, 128, 128256, 131072, true, 1e-5, 5e5, 32, 128000, 128001, false},
    {"Llama-3.1-8B", "LlamaForCausalLM", 4096, 14336, 32, 32, 8, 128, 128256, 131072, false, 1e-5, 5e5, 8, 128000, 128001, false},
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

std::string preset_list_text() {
    std::string s;
    for (const auto& p : kPresets) s += cat(s.empty() ? "" : ", ", p.name);
    return s;
}

ModelConfig preset_config(const std::string& name) {
    std::string bare = strip_org(name);
    for (const auto& p : kPresets) {
        if (bare != p.name) continue;
        const Architecture& family = *find_architecture(p.hf_class, "");
        ModelConfig c;
        c.architecture = family.hf_class;
        c.model_type = family.model_type;
        c.hidden_size = p.hidden;
        c.intermediate_size = p.intermediate;
        c.num_hidden_layers = p.layers;
        c.num_attention_heads = p.heads;
        c.num_key_value_heads = p.kv_heads;
        c.head_dim = p.head_dim;
        c.vocab_size = p.vocab;
        c.max_position_embeddings = p.max_pos;
        c.tie_word_embeddings = p.tied;
        c.rms_norm_eps = p.eps;
        c.rope_theta = p.theta;
        if (p.llama3_factor > 0) {
            c.rope_type = "llama3";
            c.rope_factor = p.llama3_factor;
            c.rope_low_freq_factor = 1.0;
            c.rope_high_freq_factor = 4.0;
            c.rope_original_max_position_embeddings = 8192;
        }
        c.qkv_bias = family.fixed_qkv_bias;
        c.o_bias = c.mlp_bias = false;
        c.qk_norm = family.qk_norm;
        c.bos_token_id = p.bos;
        c.eos_token_id = p.eos;
        c.sliding_window = p.window_is_max_pos ? p.max_pos : 0;
        c.max_window_layers = family.sliding_window_fields ? p.layers : 0;
        c.validate(std::string("preset ") + p.name);
        return c;
    }
    std::string all;
    for (const auto& p : kPresets) all += std::string(all.empty() ? "" : ", ") + p.name;
    throw_error(cat("unknown model preset '", name, "' (built-in presets: ", all, ")"));
}

}  // namespace qtrain
