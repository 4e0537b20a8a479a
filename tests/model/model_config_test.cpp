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
    EXPECT_EQ(a.attention_bias, b.attention_bias);
    EXPECT_EQ(a.bos_token_id, b.bos_token_id);
    EXPECT_EQ(a.eos_token_id, b.eos_token_id);
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
    EXPECT_TRUE(c.attention_bias);
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
    // Newer transformers write "dtype" instead of "torch_dtype".
    EXPECT_EQ(parse(edited("dtype", "float32")).torch_dtype, "bfloat16");  // torch_dtype present wins
    j["dtype"] = "float32";
    EXPECT_EQ(parse(j.dump()).torch_dtype, "float32");
    // Null counts as absent.
    EXPECT_EQ(parse(edited("sliding_window", nullptr)).sliding_window, 0);
}

TEST(ModelConfig, ArchitectureChecks) {
    EXPECT_ERROR(parse(edited("architectures", json::array({"LlamaForCausalLM"}))), "test/config.json",
                 "LlamaForCausalLM", "Qwen2ForCausalLM");
    // No architectures list: model_type decides.
    json j = json::parse(kQwen25_05B);
    j.erase("architectures");
    EXPECT_EQ(parse(j.dump()).hidden_size, 896);
    j["model_type"] = "llama";
    EXPECT_ERROR(parse(j.dump()), "test/config.json", "llama");
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
    EXPECT_EQ(preset_names().size(), 6u);
    EXPECT_TRUE(preset_config("Qwen2.5-0.5B").tie_word_embeddings);
    EXPECT_FALSE(preset_config("Qwen2.5-7B").tie_word_embeddings);
    EXPECT_EQ(preset_config("Qwen2.5-7B").vocab_size, 152064);
}

TEST(ModelConfigPresets, OrgPrefixAndUnknown) {
    EXPECT_TRUE(has_preset("Qwen/Qwen2.5-7B"));
    expect_same(preset_config("Qwen/Qwen2.5-7B"), preset_config("Qwen2.5-7B"));
    EXPECT_FALSE(has_preset("Qwen2.5-70B"));
    EXPECT_FALSE(has_preset("qwen2.5-7b"));
    EXPECT_ERROR(preset_config("Qwen2.5-70B"), "'Qwen2.5-70B'", "Qwen2.5-0.5B", "Qwen2.5-32B");
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
