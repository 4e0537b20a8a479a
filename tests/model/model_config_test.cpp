// config.json parsing: a real Qwen2.5 config must give exactly the published shape, anything qtrain
// cannot train must be refused up front (not discovered as a shape error deep in loading), and
// the presets must have the published parameter counts.
#include "model/model_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "model/parameters.h"
#include "test_util.h"

namespace qtrain {
namespace {

using json = nlohmann::json;

// Qwen/Qwen2.5-0.5B config.json as published on the hub.
constexpr const char* kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
// num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=True,
// max_position_embeddings=128, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
// .save_pretrained() with transformers 5.17.0: the RoPE base only inside rope_parameters.
constexpr const char* kTinyV5 = R"({
  "attention_dropout": 0.0,
  "bos_token_id": null,
  "eos_token_id": null,
  "hidden_act": "silu",
  "hidden_size": 32,
  "initializer_range": 0.02,
  "intermediate_size": 64,
  "layer_types": ["full_attention", "full_attention"],
  "max_position_embeddings": 128,
  "max_window_layers": 28,
  "model_type": "qwen2",
  "num_attention_heads": 4,
  "num_hidden_layers": 2,
  "num_key_value_heads": 2,
  "pad_token_id": null,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
  "sliding_window": null,
  "tie_word_embeddings": true,
  "transformers_version": "5.17.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 64
})";

// The same with transformers 4.57.6 (Qwen2Config(rope_theta=500000.0, ...)).
constexpr const char* kTinyV4 = R"({
  "attention_dropout": 0.0,
  "hidden_act": "silu",
  "hidden_size": 32,
  "initializer_range": 0.02,
  "intermediate_size": 64,
  "layer_types": ["full_attention", "full_attention"],
  "max_position_embeddings": 128,
  "max_window_layers": 28,
  "model_type": "qwen2",
  "num_attention_heads": 4,
  "num_hidden_layers": 2,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 500000.0,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "transformers_version": "4.57.6",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 64
})";

// The 0.5B config with one field replaced (or removed, with a null json and remove=true).
std::string edited(const char* key, const json& value, bool remove = false) {
    json j = json::parse(kQwen25_05B);
    if (remove) j.erase(key);
    else j[key] = value;
    return j.dump();
}

ModelConfig parse(const std::string& text) { return parse_model_config(text, "test/config.json"); }

void expect_same(const ModelConfig& a, const ModelConfig& b) {
    EXPECT_EQ(a.architecture, b.architecture);
    EXPECT_EQ(a.model_type, b.model_type);
    EXPECT_EQ(a.vocab_size, b.vocab_size);
    EXPECT_EQ(a.hidden_size, b.hidden_size);
    EXPECT_EQ(a.intermediate_size, b.intermediate_size);
    EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
    EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
    EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
    EXPECT_EQ(a.head_dim, b.head_dim);
    EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
    EXPECT_EQ(a.rope_theta, b.rope_theta);
    EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
    EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
    EXPECT_EQ(a.qkv_bias, b.qkv_bias);
    EXPECT_EQ(a.o_bias, b.o_bias);
    EXPECT_EQ(a.mlp_bias, b.mlp_bias);
    EXPECT_EQ(a.qk_norm, b.qk_norm);
    EXPECT_EQ(a.rope_type, b.rope_type);
    EXPECT_EQ(a.rope_factor, b.rope_factor);
    EXPECT_EQ(a.rope_low_freq_factor, b.rope_low_freq_factor);
    EXPECT_EQ(a.rope_high_freq_factor, b.rope_high_freq_factor);
    EXPECT_EQ(a.rope_original_max_position_embeddings, b.rope_original_max_position_embeddings);
    EXPECT_EQ(a.bos_token_id, b.bos_token_id);
    EXPECT_EQ(a.eos_token_id, b.eos_token_id);
    EXPECT_EQ(a.pad_token_id, b.pad_token_id);
    EXPECT_EQ(a.use_sliding_window, b.use_sliding_window);
    EXPECT_EQ(a.sliding_window, b.sliding_window);
    EXPECT_EQ(a.max_window_layers, b.max_window_layers);
    EXPECT_EQ(a.hidden_act, b.hidden_act);
    EXPECT_EQ(a.initializer_range, b.initializer_range);
    EXPECT_EQ(a.torch_dtype, b.torch_dtype);
    EXPECT_EQ(a.attention_dropout, b.attention_dropout);
}

TEST(ModelConfig, ParsesQwen25_05B) {
    const ModelConfig c = parse(kQwen25_05B);
    EXPECT_EQ(c.architecture, "Qwen2ForCausalLM");
    EXPECT_EQ(c.vocab_size, 151936);
    EXPECT_EQ(c.hidden_size, 896);
    EXPECT_EQ(c.intermediate_size, 4864);
    EXPECT_EQ(c.num_hidden_layers, 24);
    EXPECT_EQ(c.num_attention_heads, 14);
    EXPECT_EQ(c.num_key_value_heads, 2);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.q_dim(), 896);
    EXPECT_EQ(c.kv_dim(), 128);
    EXPECT_EQ(c.max_position_embeddings, 32768);
    EXPECT_EQ(c.rope_theta, 1e6);
    EXPECT_EQ(c.rms_norm_eps, 1e-6);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_FALSE(c.o_bias || c.mlp_bias || c.qk_norm);
    EXPECT_EQ(c.bos_token_id, 151643);
    EXPECT_EQ(c.eos_token_id, 151643);
    EXPECT_EQ(c.sliding_window, 32768);
    EXPECT_EQ(c.max_window_layers, 24);
    EXPECT_EQ(c.torch_dtype, "bfloat16");
    // The count transformers reports for Qwen2.5-0.5B (tied embeddings counted once).
    EXPECT_EQ(c.num_parameters(), 494032768);
    expect_same(c, preset_config("Qwen2.5-0.5B"));
}

TEST(ModelConfig, TiedAndUntiedEmbeddings) {
    const ModelConfig tied = parse(kQwen25_05B);
    const ModelConfig untied = parse(edited("tie_word_embeddings", false));
    EXPECT_FALSE(untied.tie_word_embeddings);
    EXPECT_EQ(untied.num_parameters() - tied.num_parameters(), int64_t{151936} * 896);
    // Absent means false, as in transformers' Qwen2Config.
    EXPECT_FALSE(parse(edited("tie_word_embeddings", nullptr, true)).tie_word_embeddings);
}

TEST(ModelConfig, EosList) {
    EXPECT_EQ(parse(edited("eos_token_id", json::array({151645, 151643}))).eos_token_id, 151645);
    EXPECT_EQ(parse(edited("eos_token_id", 151645)).eos_token_id, 151645);
    EXPECT_ERROR(parse(edited("eos_token_id", json::array())), "test/config.json", "eos_token_id", "empty");
    EXPECT_ERROR(parse(edited("eos_token_id", json::array({"x"}))), "test/config.json", "eos_token_id");
}

TEST(ModelConfig, OptionalFieldsDefault) {
    json j = json::parse(kQwen25_05B);
    for (const char* k : {"num_key_value_heads", "rope_theta", "rms_norm_eps", "bos_token_id", "eos_token_id",
                          "sliding_window", "max_window_layers", "hidden_act", "torch_dtype", "attention_dropout",
                          "max_position_embeddings"})
        j.erase(k);
    const ModelConfig c = parse(j.dump());
    EXPECT_EQ(c.num_key_value_heads, 14);  // no GQA when absent
    EXPECT_EQ(c.rope_theta, 10000.0);      // transformers' Qwen2Config default
    EXPECT_EQ(c.max_window_layers, 24);
    EXPECT_EQ(c.bos_token_id, -1);  // none, as in transformers (null)
    EXPECT_EQ(c.eos_token_id, -1);
    EXPECT_EQ(c.pad_token_id, -1);
    // transformers 5 writes "dtype" instead of "torch_dtype"; with both, 4.57 and 5.x keep "dtype".
    EXPECT_EQ(parse(edited("dtype", "float32")).torch_dtype, "float32");
    j["dtype"] = "float16";
    EXPECT_EQ(parse(j.dump()).torch_dtype, "float16");
    // Null counts as absent.
    EXPECT_EQ(parse(edited("sliding_window", nullptr)).sliding_window, 0);
}

TEST(ModelConfig, ArchitectureChecks) {
    EXPECT_ERROR(parse(edited("architectures", json::array({"MistralForCausalLM"}))), "test/config.json",
                 "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM");
    // the class and model_type must name the same family (transformers builds model_type's)
    EXPECT_ERROR(parse(edited("architectures", json::array({"LlamaForCausalLM"}))), "test/config.json",
                 "LlamaForCausalLM", "'model_type' = 'qwen2'", "'llama'");
    // No architectures list: model_type decides.
    json j = json::parse(kQwen25_05B);
    j.erase("architectures");
    EXPECT_EQ(parse(j.dump()).hidden_size, 896);
    j["model_type"] = "mistral";
    EXPECT_ERROR(parse(j.dump()), "test/config.json", "mistral");
}

TEST(ModelConfig, MissingAndWrongTypedFields) {
    for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads"}) {
        SCOPED_TRACE(k);
        EXPECT_ERROR(parse(edited(k, nullptr, true)), "test/config.json", "missing", std::string("'") + k + "'");
        EXPECT_ERROR(parse(edited(k, nullptr)), "test/config.json", "missing", std::string("'") + k + "'");
    }
    EXPECT_ERROR(parse(edited("hidden_size", "896")), "test/config.json", "'hidden_size'", "wrong type", "string");
    EXPECT_ERROR(parse(edited("hidden_size", true)), "'hidden_size'", "wrong type");
    EXPECT_ERROR(parse(edited("hidden_size", 896.5)), "'hidden_size'", "wrong type", "896.5");
    EXPECT_ERROR(parse(edited("vocab_size", 1e12)), "'vocab_size'");
    EXPECT_ERROR(parse(edited("vocab_size", int64_t{1} << 40)), "'vocab_size'", "32-bit");
    EXPECT_ERROR(parse(edited("tie_word_embeddings", "yes")), "'tie_word_embeddings'", "wrong type");
    EXPECT_ERROR(parse(edited("tie_word_embeddings", 1)), "'tie_word_embeddings'", "wrong type");
    EXPECT_ERROR(parse(edited("rope_theta", "1e6")), "'rope_theta'", "wrong type");
    EXPECT_ERROR(parse(edited("hidden_act", 3)), "'hidden_act'", "wrong type");
    EXPECT_ERROR(parse(edited("num_hidden_layers", -2)), "num_hidden_layers", "-2");
    EXPECT_ERROR(parse(edited("vocab_size", 0)), "vocab_size", "positive");
    EXPECT_EQ(parse(edited("rope_theta", 1000000)).rope_theta, 1e6);  // an integer is a fine number
}

TEST(ModelConfig, BadJson) {
    EXPECT_ERROR(parse("{\"hidden_size\": 896,"), "test/config.json", "not valid JSON");
    EXPECT_ERROR(parse(""), "test/config.json", "not valid JSON");
    EXPECT_ERROR(parse("[1, 2]"), "test/config.json", "JSON object");
}

TEST(ModelConfig, HeadShapes) {
    // 900 is not a multiple of 14 heads.
    EXPECT_ERROR(parse(edited("hidden_size", 900)), "test/config.json", "hidden_size", "900", "num_attention_heads");
    EXPECT_ERROR(parse(edited("num_key_value_heads", 3)), "test/config.json", "num_key_value_heads", "3", "14");
    EXPECT_ERROR(parse(edited("num_key_value_heads", 28)), "num_key_value_heads");
    EXPECT_ERROR(parse(edited("num_attention_heads", 0)), "num_attention_heads");
    EXPECT_ERROR(parse(edited("num_key_value_heads", 0)), "num_key_value_heads");
    // head_dim, when given, must agree with hidden_size / heads for Qwen2.
    EXPECT_EQ(parse(edited("head_dim", 64)).head_dim, 64);
    EXPECT_ERROR(parse(edited("head_dim", 128)), "head_dim", "128");
}

TEST(ModelConfig, UnsupportedFeaturesRejected) {
    EXPECT_ERROR(parse(edited("rope_scaling", {{"type", "yarn"}, {"factor", 4.0}})), "test/config.json",
                 "rope_scaling", "yarn");
    EXPECT_ERROR(parse(edited("rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}})), "rope_scaling",
                 "dynamic");
    EXPECT_ERROR(parse(edited("rope_scaling", {{"rope_type", 7}})), "rope_scaling");
    EXPECT_ERROR(parse(edited("rope_scaling", "linear")), "rope_scaling");
    EXPECT_EQ(parse(edited("rope_scaling", nullptr)).hidden_size, 896);
    EXPECT_EQ(parse(edited("rope_scaling", {{"rope_type", "default"}})).hidden_size, 896);
    EXPECT_ERROR(parse(edited("use_sliding_window", true)), "test/config.json", "use_sliding_window");
    EXPECT_ERROR(parse(edited("attention_dropout", 0.1)), "attention_dropout", "0.1");
    EXPECT_ERROR(parse(edited("hidden_act", "gelu")), "hidden_act", "gelu");
    EXPECT_ERROR(parse(edited("rms_norm_eps", 0)), "rms_norm_eps");
}

// The shape both transformers versions saved, whichever form holds the RoPE base.
void expect_tiny(const ModelConfig& c) {
    EXPECT_EQ(c.vocab_size, 64);
    EXPECT_EQ(c.hidden_size, 32);
    EXPECT_EQ(c.num_attention_heads, 4);
    EXPECT_EQ(c.num_key_value_heads, 2);
    EXPECT_EQ(c.head_dim, 8);
    EXPECT_EQ(c.num_hidden_layers, 2);
    EXPECT_EQ(c.rope_theta, 500000.0);
    EXPECT_EQ(c.rms_norm_eps, 1e-5);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_EQ(c.bos_token_id, -1);
    EXPECT_EQ(c.pad_token_id, -1);
}

TEST(ModelConfigRope, TransformersFiveForm) {
    expect_tiny(parse(kTinyV5));
    expect_tiny(parse(kTinyV4));
    // rope_type may be left out (transformers 5 then takes "default").
    json j = json::parse(kTinyV5);
    j["rope_parameters"] = {{"rope_theta", 1e6}};
    EXPECT_EQ(parse(j.dump()).rope_theta, 1e6);
    // No base anywhere: transformers' default in both versions.
    j["rope_parameters"] = {{"rope_type", "default"}};
    EXPECT_EQ(parse(j.dump()).rope_theta, 10000.0);
    j["rope_parameters"] = nullptr;
    EXPECT_EQ(parse(j.dump()).rope_theta, 10000.0);
}

TEST(ModelConfigRope, BothFormsMustAgree) {
    json j = json::parse(kTinyV5);
    j["rope_theta"] = 500000.0;  // what qtrain exports: both present and equal
    EXPECT_EQ(parse(j.dump()).rope_theta, 500000.0);
    j["rope_theta"] = 1e6;  // 4.x would use 1e6, 5.x 500000
    EXPECT_ERROR(parse(j.dump()), "test/config.json", "'rope_theta' = 1000000.0",
                 "'rope_parameters.rope_theta' = 500000.0", "disagrees");
    // A 4.x rope_scaling replaces rope_parameters in transformers 5, which then drops its base.
    j = json::parse(kTinyV5);
    j["rope_scaling"] = {{"type", "default"}};
    EXPECT_ERROR(parse(j.dump()), "test/config.json", "'rope_parameters.rope_theta' = 500000.0", "10000.0",
                 "rope_scaling");
    j["rope_theta"] = 500000.0;  // now every reader gets 500000
    EXPECT_EQ(parse(j.dump()).rope_theta, 500000.0);
    // rope_scaling's own base, which transformers 4.x ignores.
    j = json::parse(kTinyV4);
    j.erase("rope_theta");
    j["rope_scaling"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
    EXPECT_ERROR(parse(j.dump()), "test/config.json", "'rope_scaling.rope_theta' = 500000.0", "'rope_theta'");
    j["rope_theta"] = 500000.0;
    EXPECT_EQ(parse(j.dump()).rope_theta, 500000.0);
    j["rope_theta"] = 1e6;
    EXPECT_ERROR(parse(j.dump()), "'rope_scaling.rope_theta' = 500000.0", "'rope_theta' = 1000000.0");
}

TEST(ModelConfigRope, OnlyImplementedRopeTypes) {
    for (const char* type : {"linear", "dynamic", "yarn", "longrope", "mrope"}) {
        SCOPED_TRACE(type);
        json j = json::parse(kTinyV5);
        j["rope_parameters"]["rope_type"] = type;
        j["rope_parameters"]["factor"] = 4.0;
        EXPECT_ERROR(parse(j.dump()), "test/config.json", "'rope_parameters.rope_type'", type, "not supported");
        j = json::parse(kTinyV4);
        j["rope_scaling"] = {{"type", type}, {"factor", 4.0}};
        EXPECT_ERROR(parse(j.dump()), "test/config.json", "'rope_scaling.type'", type);
    }
    json j = json::parse(kTinyV5);
    j["rope_parameters"]["type"] = "yarn";  // the old name, which 4.x prefers
    EXPECT_ERROR(parse(j.dump()), "'rope_parameters.type'", "yarn");
    j = json::parse(kTinyV5);
    j["rope_parameters"] = "default";
    EXPECT_ERROR(parse(j.dump()), "test/config.json", "'rope_parameters'", "wrong type");
    j["rope_parameters"] = {{"rope_theta", "1e6"}};
    EXPECT_ERROR(parse(j.dump()), "'rope_parameters.rope_theta'", "wrong type");
    // transformers 5's per-layer-type form, which its Qwen2 model cannot build from.
    j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 500000.0}}}};
    EXPECT_ERROR(parse(j.dump()), "test/config.json", "'rope_parameters.full_attention'", "per layer type");
}

TEST(ModelConfigRope, PartialRotaryRefused) {
    EXPECT_ERROR(parse(edited("partial_rotary_factor", 0.5)), "test/config.json", "'partial_rotary_factor' = 0.5");
    json j = json::parse(kTinyV5);
    j["rope_parameters"]["partial_rotary_factor"] = 0.25;
    EXPECT_ERROR(parse(j.dump()), "test/config.json", "'rope_parameters.partial_rotary_factor' = 0.25");
    j["rope_parameters"]["partial_rotary_factor"] = 1.0;
    EXPECT_EQ(parse(j.dump()).rope_theta, 500000.0);
    EXPECT_EQ(parse(edited("partial_rotary_factor", 1)).rope_theta, 1e6);
    EXPECT_ERROR(parse(edited("partial_rotary_factor", "half")), "'partial_rotary_factor'", "wrong type");
}

TEST(ModelConfig, LayerTypesMustBeFullAttention) {
    json j = json::parse(kTinyV5);
    j["layer_types"] = {"full_attention", "sliding_attention"};
    EXPECT_ERROR(parse(j.dump()), "test/config.json", "'layer_types[1]' = 'sliding_attention'", "not supported");
    j["layer_types"] = {"full_attention"};
    EXPECT_ERROR(parse(j.dump()), "test/config.json", "'layer_types'", "1 entries", "num_hidden_layers is 2");
    j["layer_types"] = "full_attention";
    EXPECT_ERROR(parse(j.dump()), "'layer_types'", "wrong type");
    j["layer_types"] = nullptr;
    EXPECT_EQ(parse(j.dump()).num_hidden_layers, 2);
    // use_sliding_window alone is refused too: transformers then makes layers >= max_window_layers sliding.
    j = json::parse(kTinyV5);
    j["use_sliding_window"] = true;
    j["sliding_window"] = 16;
    EXPECT_ERROR(parse(j.dump()), "test/config.json", "'use_sliding_window' = true");
}

TEST(ModelConfig, GenericFieldsThatChangeTheModelRefused) {
    EXPECT_ERROR(parse(edited("quantization_config", {{"quant_method", "gptq"}, {"bits", 4}})), "test/config.json",
                 "'quantization_config'", "gptq");
    EXPECT_ERROR(parse(edited("per_layer_config", {{"0", {{"intermediate_size", 128}}}})), "test/config.json",
                 "'per_layer_config'");
    EXPECT_ERROR(parse(edited("pruned_heads", {{"0", {1, 2}}})), "test/config.json", "'pruned_heads'");
    EXPECT_ERROR(parse(edited("torchscript", true)), "test/config.json", "'torchscript'");
    // Their neutral values, as transformers writes or reads them.
    for (const char* k : {"quantization_config", "per_layer_config", "pruned_heads"}) {
        SCOPED_TRACE(k);
        EXPECT_EQ(parse(edited(k, nullptr)).hidden_size, 896);
        EXPECT_EQ(parse(edited(k, json::object())).hidden_size, 896);
    }
    EXPECT_EQ(parse(edited("torchscript", false)).hidden_size, 896);
    // Fields transformers' Qwen2 never reads change nothing there either.
    EXPECT_EQ(parse(edited("use_mrope", false)).hidden_size, 896);
}

TEST(ModelConfig, TokenIds) {
    const ModelConfig c = parse(edited("pad_token_id", 151643));
    EXPECT_EQ(c.pad_token_id, 151643);
    EXPECT_EQ(c.bos_token_id, 151643);
    EXPECT_EQ(parse(edited("bos_token_id", nullptr)).bos_token_id, -1);
    EXPECT_ERROR(parse(edited("pad_token_id", "pad")), "test/config.json", "'pad_token_id'", "wrong type");
    // Exported as given: a null id stays null (transformers 5 warns about ids outside the vocabulary).
    ModelConfig tiny = parse(kTinyV5);
    json j = json::parse(model_config_to_json(tiny));
    EXPECT_TRUE(j["bos_token_id"].is_null());
    EXPECT_TRUE(j["eos_token_id"].is_null());
    EXPECT_FALSE(j.contains("pad_token_id"));
    tiny.pad_token_id = 3;
    tiny.eos_token_id = 2;
    j = json::parse(model_config_to_json(tiny));
    EXPECT_EQ(j["pad_token_id"], 3);
    EXPECT_EQ(j["eos_token_id"], 2);
    expect_same(parse(j.dump()), tiny);
}

// Published sizes: https://huggingface.co/Qwen (model cards), as "Number of Parameters".
TEST(ModelConfigPresets, PublishedParameterCounts) {
    const std::pair<const char*, double> published[] = {
        {"Qwen2.5-0.5B", 0.49e9}, {"Qwen2.5-1.5B", 1.54e9}, {"Qwen2.5-3B", 3.09e9},
        {"Qwen2.5-7B", 7.62e9},   {"Qwen2.5-14B", 14.7e9},  {"Qwen2.5-32B", 32.8e9},
    };
    for (const auto& [name, count] : published) {
        SCOPED_TRACE(name);
        ASSERT_TRUE(has_preset(name));
        const ModelConfig c = preset_config(name);
        EXPECT_NEAR(static_cast<double>(c.num_parameters()) / count, 1.0, 0.01) << c.num_parameters();
        EXPECT_EQ(c.hidden_size % c.num_attention_heads, 0);
        EXPECT_EQ(c.head_dim, 128 - 64 * (c.hidden_size == 896));  // 64 for 0.5B, 128 for the rest
    }
    EXPECT_EQ(preset_names().size(), 15u);
    EXPECT_TRUE(preset_config("Qwen2.5-0.5B").tie_word_embeddings);
    EXPECT_FALSE(preset_config("Qwen2.5-7B").tie_word_embeddings);
    EXPECT_EQ(preset_config("Qwen2.5-7B").vocab_size, 152064);
}

TEST(ModelConfigPresets, OrgPrefixAndUnknown) {
    EXPECT_TRUE(has_preset("Qwen/Qwen2.5-7B"));
    expect_same(preset_config("Qwen/Qwen2.5-7B"), preset_config("Qwen2.5-7B"));
    EXPECT_FALSE(has_preset("Qwen2.5-70B"));
    EXPECT_FALSE(has_preset("qwen2.5-7b"));
    EXPECT_ERROR(preset_config("Qwen2.5-70B"), "'Qwen2.5-70B'", "Qwen2.5-0.5B", "Qwen2.5-32B", "Qwen3-0.6B",
                 "Llama-3.1-8B");
}

TEST(ModelConfigJson, RoundTrips) {
    for (const auto& name : preset_names()) {
        SCOPED_TRACE(name);
        const ModelConfig c = preset_config(name);
        expect_same(parse(model_config_to_json(c)), c);
    }
    ModelConfig c = parse(edited("eos_token_id", json::array({151645, 151643})));
    c.torch_dtype = "float32";
    c.rope_theta = 12345.5;
    const std::string text = model_config_to_json(c);
    expect_same(parse(text), c);
    const json j = json::parse(text);
    EXPECT_EQ(j["architectures"], json::array({"Qwen2ForCausalLM"}));
    EXPECT_EQ(j["model_type"], "qwen2");
    EXPECT_EQ(j["eos_token_id"], 151645);
}

// What transformers 4.x reads (top-level rope_theta, torch_dtype before 4.56) and what 5.x reads
// (rope_parameters, dtype), with the same values; no sliding layer for either.
TEST(ModelConfigJson, WritesBothTransformersForms) {
    for (const char* text : {kTinyV5, kTinyV4}) {
        ModelConfig c = parse(text);
        c.torch_dtype = "float32";
        const json j = json::parse(model_config_to_json(c));
        EXPECT_EQ(j["rope_theta"], 500000.0);
        EXPECT_EQ(j["rope_parameters"], json({{"rope_type", "default"}, {"rope_theta", 500000.0}}));
        EXPECT_EQ(j["rms_norm_eps"], 1e-5);
        EXPECT_EQ(j["tie_word_embeddings"], true);
        EXPECT_EQ(j["layer_types"], json({"full_attention", "full_attention"}));
        EXPECT_EQ(j["use_sliding_window"], false);
        EXPECT_EQ(j["dtype"], "float32");
        EXPECT_EQ(j["torch_dtype"], "float32");
        EXPECT_FALSE(j.contains("rope_scaling"));
        expect_same(parse(j.dump()), c);
        // Each version's view alone gives the same model.
        json v4 = j, v5 = j;
        v4.erase("rope_parameters");
        v5.erase("rope_theta");
        expect_same(parse(v4.dump()), c);
        expect_same(parse(v5.dump()), c);
    }
}

TEST(ModelConfigJson, LoadFromFile) {
    test::TempDir dir;
    const std::string path = dir.file("config.json");
    test::write_file(path, kQwen25_05B);
    EXPECT_EQ(load_model_config(path).hidden_size, 896);
    test::write_file(path, "{");
    EXPECT_ERROR(load_model_config(path), path, "not valid JSON");
    std::filesystem::remove_all(dir.path);
    EXPECT_ERROR(load_model_config(path), path);
}


// ---- Llama 3.x and Qwen3 (the architecture description) ----

// meta-llama/Llama-3.2-1B config.json as published (transformers 4.x form: rope_scaling).
constexpr const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// Qwen/Qwen3-0.6B config.json as published: head_dim 128 where hidden / heads is 64.
constexpr const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

std::string edited_from(const char* base, const char* key, const json& value, bool remove = false) {
    json j = json::parse(base);
    if (remove) j.erase(key);
    else j[key] = value;
    return j.dump();
}

bool has_tensor(const ModelConfig& c, const std::string& name) {
    for (const ParamSpec& p : model_parameters(c))
        if (p.name == name) return true;
    return false;
}

TEST(ModelFamilies, ParsesLlama32_1B) {
    const ModelConfig c = parse(kLlama32_1B);
    EXPECT_EQ(c.architecture, "LlamaForCausalLM");
    EXPECT_EQ(c.model_type, "llama");
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.rope_type, "llama3");
    EXPECT_EQ(c.rope_factor, 32.0);
    EXPECT_EQ(c.rope_low_freq_factor, 1.0);
    EXPECT_EQ(c.rope_high_freq_factor, 4.0);
    EXPECT_EQ(c.rope_original_max_position_embeddings, 8192);
    EXPECT_EQ(c.rope_theta, 500000.0);
    EXPECT_EQ(c.rms_norm_eps, 1e-5);
    EXPECT_EQ(c.bos_token_id, 128000);
    EXPECT_EQ(c.eos_token_id, 128001);
    EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias || c.qk_norm);
    EXPECT_FALSE(has_tensor(c, "model.layers.0.self_attn.q_proj.bias"));
    // published: 1.24B parameters (tied)
    EXPECT_EQ(c.num_parameters(), 1235814400);
    expect_same(c, preset_config("meta-llama/Llama-3.2-1B"));
    // transformers 5's form: everything in rope_parameters, no top-level rope_theta
    json j = json::parse(kLlama32_1B);
    j["rope_parameters"] = j["rope_scaling"];
    j["rope_parameters"]["rope_theta"] = 500000.0;
    j.erase("rope_scaling");
    j.erase("rope_theta");
    expect_same(parse(j.dump()), c);
}

TEST(ModelFamilies, LlamaBiasesFollowTheConfig) {
    const ModelConfig a = parse(edited_from(kLlama32_1B, "attention_bias", true));
    EXPECT_TRUE(a.qkv_bias && a.o_bias && !a.mlp_bias);
    for (const char* t : {"q_proj", "k_proj", "v_proj", "o_proj"})
        EXPECT_TRUE(has_tensor(a, cat("model.layers.3.self_attn.", t, ".bias"))) << t;
    const ModelConfig m = parse(edited_from(kLlama32_1B, "mlp_bias", true));
    EXPECT_TRUE(m.mlp_bias && !m.qkv_bias && !m.o_bias);
    for (const char* t : {"gate_proj", "up_proj", "down_proj"})
        EXPECT_TRUE(has_tensor(m, cat("model.layers.15.mlp.", t, ".bias"))) << t;
    EXPECT_EQ(m.num_parameters() - parse(kLlama32_1B).num_parameters(), int64_t{16} * (2 * 8192 + 2048));
    // absent head_dim: hidden / heads, as LlamaConfig
    EXPECT_EQ(parse(edited_from(kLlama32_1B, "head_dim", nullptr, true)).head_dim, 64);
    // a head_dim of its own is Llama's to have
    EXPECT_EQ(parse(edited_from(kLlama32_1B, "head_dim", 128)).q_dim(), 4096);
}

TEST(ModelFamilies, ParsesQwen3_06B) {
    const ModelConfig c = parse(kQwen3_06B);
    EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.q_dim(), 2048);  // != hidden_size 1024
    EXPECT_TRUE(c.qk_norm);
    EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias);
    EXPECT_EQ(c.rope_type, "default");
    EXPECT_EQ(c.eos_token_id, 151645);
    const std::vector<ParamSpec> p = model_parameters(c);
    bool q_norm = false;
    for (const ParamSpec& s : p)
        if (s.name == "model.layers.27.self_attn.q_norm.weight") {
            q_norm = true;
            EXPECT_EQ(s.shape, std::vector<int64_t>{128});
            EXPECT_EQ(s.kind, ParamKind::Norm);
            EXPECT_FALSE(s.decay());
        }
    EXPECT_TRUE(q_norm);
    EXPECT_TRUE(has_tensor(c, "model.layers.0.self_attn.k_norm.weight"));
    EXPECT_FALSE(has_tensor(c, "model.layers.0.self_attn.q_proj.bias"));
    // the count transformers reports for Qwen3-0.6B (tied)
    EXPECT_EQ(c.num_parameters(), 596049920);
    expect_same(c, preset_config("Qwen/Qwen3-0.6B"));
    // head_dim absent: Qwen3Config's default 128, not hidden / heads
    EXPECT_EQ(parse(edited_from(kQwen3_06B, "head_dim", nullptr, true)).head_dim, 128);
    EXPECT_TRUE(parse(edited_from(kQwen3_06B, "attention_bias", true)).o_bias);
}

TEST(ModelFamilies, UnsupportedSettingsNameTheField) {
    EXPECT_ERROR(parse(edited_from(kQwen3_06B, "use_sliding_window", true)), "test/config.json", "use_sliding_window");
    EXPECT_ERROR(parse(edited_from(kLlama32_1B, "hidden_act", "gelu")), "hidden_act", "gelu");
    EXPECT_ERROR(parse(edited_from(kLlama32_1B, "pretraining_tp", 2)), "test/config.json", "'pretraining_tp' = 2");
    EXPECT_ERROR(parse(edited_from(kLlama32_1B, "architectures", json::array({"Qwen3MoeForCausalLM"}))),
                 "Qwen3MoeForCausalLM", "unsupported architecture");
    json j = json::parse(kLlama32_1B);
    j["model_type"] = "qwen3_moe";
    EXPECT_ERROR(parse(j.dump()), "'model_type' = 'qwen3_moe'");
    j = json::parse(kLlama32_1B);
    j["rope_scaling"]["rope_type"] = "yarn";
    EXPECT_ERROR(parse(j.dump()), "'rope_scaling.rope_type' = 'yarn'", "not supported");
    j = json::parse(kLlama32_1B);
    j["rope_scaling"].erase("low_freq_factor");
    EXPECT_ERROR(parse(j.dump()), "test/config.json", "missing 'rope_scaling.low_freq_factor'");
    j = json::parse(kLlama32_1B);
    j["rope_scaling"]["high_freq_factor"] = 1.0;  // not above low_freq_factor: the ramp divides by zero
    EXPECT_ERROR(parse(j.dump()), "low_freq_factor < high_freq_factor");
    j = json::parse(kLlama32_1B);
    j["rope_scaling"]["original_max_position_embeddings"] = 8192.5;
    EXPECT_ERROR(parse(j.dump()), "original_max_position_embeddings", "positive integer");
    // both forms present: they must describe the same frequencies
    j = json::parse(kLlama32_1B);
    j["rope_parameters"] = j["rope_scaling"];
    j["rope_parameters"]["rope_theta"] = 500000.0;
    EXPECT_EQ(parse(j.dump()).rope_factor, 32.0);
    j["rope_parameters"]["factor"] = 8.0;
    EXPECT_ERROR(parse(j.dump()), "'rope_parameters.factor' = 8.0", "'rope_scaling.factor' = 32.0");
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
    EXPECT_ERROR(parse(j.dump()), "'rope_parameters' (rope_type 'default')", "'rope_scaling' (rope_type 'llama3')");
    j = json::parse(kLlama32_1B);
    j["rope_scaling"]["type"] = "default";  // 4.x reads 'type' first, 5.x 'rope_type'
    EXPECT_ERROR(parse(j.dump()), "disagree");
}

// Published sizes (model cards): Qwen3 "Number of Parameters", Llama 3.2 / 3.1 in billions.
TEST(ModelFamilies, PresetsHaveThePublishedShapes) {
    const std::pair<const char*, double> published[] = {
        {"Qwen3-0.6B", 0.6e9},     {"Qwen3-1.7B", 1.7e9},     {"Qwen3-4B", 4.0e9},    {"Qwen3-8B", 8.2e9},
        {"Qwen3-14B", 14.8e9},     {"Qwen3-32B", 32.8e9},     {"Llama-3.2-1B", 1.23e9},
        {"Llama-3.2-3B", 3.21e9},  {"Llama-3.1-8B", 8.03e9},
    };
    for (const auto& [name, count] : published) {
        SCOPED_TRACE(name);
        const ModelConfig c = preset_config(name);
        EXPECT_NEAR(static_cast<double>(c.num_parameters()) / count, 1.0, 0.02) << c.num_parameters();
        EXPECT_EQ(c.qk_norm, c.model_type == "qwen3");
        EXPECT_EQ(c.rope_type, c.model_type == "llama" ? "llama3" : "default");
        expect_same(parse(model_config_to_json(c)), c);
    }
    EXPECT_EQ(preset_config("Llama-3.1-8B").rope_factor, 8.0);
    EXPECT_EQ(preset_config("Llama-3.2-3B").rope_factor, 32.0);
    EXPECT_FALSE(preset_config("Qwen3-8B").tie_word_embeddings);
    EXPECT_TRUE(preset_config("Qwen3-4B").tie_word_embeddings);
}

// What each family's config class reads, in both transformers forms, and only that.
TEST(ModelFamilies, WritesTheFamilysFields) {
    const json l = json::parse(model_config_to_json(parse(kLlama32_1B)));
    EXPECT_EQ(l["architectures"], json::array({"LlamaForCausalLM"}));
    EXPECT_EQ(l["rope_scaling"]["rope_type"], "llama3");
    EXPECT_EQ(l["rope_scaling"]["factor"], 32.0);
    EXPECT_EQ(l["rope_parameters"]["rope_type"], "llama3");
    EXPECT_EQ(l["rope_parameters"]["original_max_position_embeddings"], 8192);
    EXPECT_EQ(l["rope_parameters"]["rope_theta"], 500000.0);
    EXPECT_EQ(l["rope_theta"], 500000.0);
    EXPECT_EQ(l["head_dim"], 64);
    EXPECT_EQ(l["attention_bias"], false);
    EXPECT_EQ(l["mlp_bias"], false);
    EXPECT_FALSE(l.contains("use_sliding_window") || l.contains("layer_types"));
    // each transformers version's view alone gives the same model
    json v4 = l, v5 = l;
    v4.erase("rope_parameters");
    v5.erase("rope_scaling");
    v5.erase("rope_theta");
    expect_same(parse(v4.dump()), parse(kLlama32_1B));
    expect_same(parse(v5.dump()), parse(kLlama32_1B));
    const json q = json::parse(model_config_to_json(parse(kQwen3_06B)));
    EXPECT_EQ(q["head_dim"], 128);
    EXPECT_EQ(q["attention_bias"], false);
    EXPECT_FALSE(q.contains("mlp_bias") || q.contains("rope_scaling"));
    EXPECT_EQ(q["sliding_window"], nullptr);
    EXPECT_EQ(q["use_sliding_window"], false);
    const json w = json::parse(model_config_to_json(parse(kQwen25_05B)));
    EXPECT_FALSE(w.contains("head_dim") || w.contains("attention_bias"));  // Qwen2Config has neither
}

// The threaded initialisation (chunks that jump ahead in the random stream) gives exactly the
// sequential stream: value k is std * normal() after 2k draws from the tensor's seed.
TEST(InitParameter, ThreadedChunksEqualTheSequentialStream) {
    ModelConfig c = preset_config("Qwen2.5-0.5B");
    const ParamSpec spec{"model.layers.3.mlp.down_proj.weight", {896, 300}, ParamKind::Matrix, 3};  // > 4 chunks
    const uint64_t seed = 77;
    std::vector<float> got(spec.numel());
    init_parameter(spec, c, seed, got.data());
    uint64_t s = seed ^ hash_string(spec.name);
    Rng rng(splitmix64(s));
    const float std = static_cast<float>(c.initializer_range);
    for (int64_t k = 0; k < spec.numel(); ++k) ASSERT_EQ(got[k], std * rng.normal()) << "value " << k;
}

}  // namespace
}  // namespace qtrain
