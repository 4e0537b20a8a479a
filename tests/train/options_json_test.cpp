// TrainOptions::to_json / from_json, driven by the option table: every flag survives the round trip,
// and the JSON is the one the hand-written to_json of earlier versions wrote (the keys, the values
// and their JSON types), so their checkpoints still compare equal on --continue.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <type_traits>
#include <variant>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/option_table.h"
#include "train/train_options.h"

using namespace qtrain;
using json = nlohmann::json;

namespace {

// TrainOptions().to_json() as the hand-written to_json wrote it (commit 8e2747d, before the table),
// with the flags added since (--document-masking, --loss-normalization, --packing: issue 31; --lora-*,
// --train-also: issue 33; --lm-head-dtype, --fp8-weight-transposes: issue 32; --max-docs-per-row: issue
// 31's cuDNN path).
const char* const kOldDefaultJson =
    R"({"adam-epsilon":9.99999993922529e-09,"attention":"auto","attn-bwd-chunks":1,"batch-size":4,)"
    R"("beta-1":0.8999999761581421,"beta-2":0.949999988079071,"checkpoint-dir":"ckpt","ckpt-interval":0,)"
    R"("ckpt-keep":0,"comm-timeout":600.0,"continue":false,"cooldown":0,"device":"auto","document-masking":"auto",)"
    R"("eval-every-n-steps":100,"eval-file":"","eval-num-steps":100,"final-lr-fraction":1.0,)"
    R"("force-resume":false,"fp8-fast-accum":"off","fp8-weight-transposes":"kept","from-scratch":false,"gemm-autotune":false,"gpu-ids":"",)"
    R"("gpus":1,"grad-accumulation":4,"grad-clip":1.0,"gradient-dtype":"","host-memory-limit":"",)"
    R"("learning-rate":9.999999747378752e-06,"lm-head-dtype":"bf16","lmhead-chunks":1,"log-file":"","lora-alpha":8.0,"lora-dropout":0.0,)"
    R"("lora-from":"","lora-init":"kaiming","lora-rank":0,"lora-targets":"all","loss-normalization":"auto",)"
    R"("lr-schedule":"cosine",)"
    R"("master-dtype":"fp32","matmul-dtype":"","max-docs-per-row":32,"memcpy-all-gather":false,"memory-limit":"","merge-lora":false,)"
    R"("model":"",)"
    R"("model-dtype":"","offload-double-buffer":false,"offload-gradients":false,"offload-master":false,)"
    R"("offload-opt-m":false,"offload-opt-v":false,"offload-quants":false,"offload-residual":false,)"
    R"("opt-m-dtype":"fp32","opt-v-dtype":"fp32","out-dir":"output","overwrite":false,"packing":"greedy",)"
    R"("param-grad-dtype":"fp32","persistent-quants":false,"plan-only":false,"recompute-att":false,)"
    R"("recompute-block":false,"recompute-ffn":false,"recompute-norm":false,"recompute-qkv":false,)"
    R"("recompute-swiglu":false,"rendezvous-timeout":600.0,"seed":42,"seq-len":1024,"shard-gradients":false,)"
    R"("shard-weights":false,"steps":1000,"tokenizer":"","train-also":"","train-file":"","use-cuda-graphs":false,"warmup":-1,)"
    R"("weight-decay":0.10000000149011612,"write-combined":false,"zero-level":1})";

// Its keys: every flag but --export-checkpoint (which exports and exits, so no run records it).
const std::set<std::string> kOldKeys = {
    "adam-epsilon", "attention", "attn-bwd-chunks", "batch-size", "beta-1", "beta-2", "checkpoint-dir",
    "ckpt-interval", "ckpt-keep", "comm-timeout", "continue", "cooldown", "device", "document-masking",
    "eval-every-n-steps",
    "eval-file", "eval-num-steps", "final-lr-fraction", "force-resume", "fp8-fast-accum", "fp8-weight-transposes", "from-scratch",
    "gemm-autotune", "gpu-ids", "gpus", "grad-accumulation", "grad-clip", "gradient-dtype", "host-memory-limit",
    "learning-rate", "lm-head-dtype", "lmhead-chunks", "log-file", "lora-alpha", "lora-dropout", "lora-from", "lora-init", "lora-rank",
    "lora-targets", "loss-normalization", "lr-schedule", "master-dtype", "matmul-dtype", "max-docs-per-row",
    "memcpy-all-gather", "memory-limit", "merge-lora", "model", "model-dtype", "offload-double-buffer", "offload-gradients",
    "offload-master", "offload-opt-m", "offload-opt-v", "offload-quants", "offload-residual", "opt-m-dtype",
    "opt-v-dtype", "out-dir", "overwrite", "packing", "param-grad-dtype", "persistent-quants", "plan-only",
    "recompute-att", "recompute-block", "recompute-ffn", "recompute-norm", "recompute-qkv", "recompute-swiglu",
    "rendezvous-timeout", "seed", "seq-len", "shard-gradients", "shard-weights", "steps", "tokenizer",
    "train-also", "train-file", "use-cuda-graphs", "warmup", "weight-decay", "write-combined", "zero-level"};

// A value unlike the default, for each member type (the JSON does not check choices or ranges).
void change(TrainOptions& o, const OptionMember& member) {
    std::visit(
        [&](auto m) {
            auto& v = o.*m;
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, bool>) v = !v;
            else if constexpr (std::is_same_v<V, std::string>) v += "-changed";
            else if constexpr (std::is_floating_point_v<V>) v = v * V(3) + V(0.375);  // not a round decimal
            else v = v + 7;
        },
        member);
}

bool same(const TrainOptions& a, const TrainOptions& b, const OptionMember& member) {
    return std::visit([&](auto m) { return a.*m == b.*m; }, member);
}

}  // namespace

TEST(OptionsJson, EveryFlagRoundTripsWithAValueUnlikeItsDefault) {
    const TrainOptions defaults;
    TrainOptions o;
    for (const OptionSpec& spec : train_option_table()) change(o, spec.member);
    for (const OptionSpec& spec : train_option_table())
        ASSERT_FALSE(same(o, defaults, spec.member)) << spec.name << " still has its default";

    const TrainOptions back = TrainOptions::from_json(o.to_json());
    for (const OptionSpec& spec : train_option_table()) {
        if (spec.resume == ResumeRule::NotRecorded)
            EXPECT_TRUE(same(back, defaults, spec.member)) << spec.name << " is not recorded: it keeps its default";
        else
            EXPECT_TRUE(same(back, o, spec.member)) << spec.name << " did not survive to_json/from_json";
    }
    EXPECT_EQ(back.to_json(), o.to_json());
}

TEST(OptionsJson, EveryEntryBindsItsOwnMember) {
    std::set<std::string> names;
    const auto& table = train_option_table();
    for (size_t i = 0; i < table.size(); ++i) {
        EXPECT_TRUE(names.insert(table[i].name).second) << table[i].name << " twice";
        for (const std::string& alias : table[i].aliases)
            EXPECT_TRUE(names.insert(alias).second) << alias << " twice";
        for (size_t k = 0; k < i; ++k)
            EXPECT_FALSE(table[i].member == table[k].member) << table[i].name << " and " << table[k].name;
    }
}

TEST(OptionsJson, TheDefaultsAreWhatTheHandWrittenToJsonWrote) {
    const json now = json::parse(TrainOptions().to_json());
    std::set<std::string> keys;
    for (auto it = now.begin(); it != now.end(); ++it) keys.insert(it.key());
    EXPECT_EQ(keys, kOldKeys);
    EXPECT_EQ(TrainOptions().to_json(), kOldDefaultJson);  // the same values, JSON types and text
    // a few by hand, as the old code wrote them
    EXPECT_EQ(now["batch-size"], 4);
    EXPECT_TRUE(now["batch-size"].is_number_integer());
    EXPECT_TRUE(now["learning-rate"].is_number_float());
    EXPECT_EQ(now["learning-rate"].get<double>(), double(1e-5f));  // the float, widened
    EXPECT_TRUE(now["comm-timeout"].is_number_float());  // a double, 600.0
    EXPECT_TRUE(now["seed"].is_number_unsigned());
    EXPECT_EQ(now["seed"], 42u);
    EXPECT_EQ(now["continue"], false);  // --continue under its flag's name, not the field's
    EXPECT_EQ(now["model-dtype"], "");
    EXPECT_EQ(now["lr-schedule"], "cosine");
    EXPECT_EQ(now["warmup"], -1);
    EXPECT_FALSE(now.contains("export-checkpoint"));
    EXPECT_FALSE(now.contains("batch")) << "aliases are not keys";
}

TEST(OptionsJson, TheOldJsonReadsBackAsTheDefaults) {
    EXPECT_EQ(TrainOptions::from_json(kOldDefaultJson).to_json(), TrainOptions().to_json());
}

TEST(OptionsJson, MissingKeysKeepTheirDefaultsAndUnknownKeysAreIgnored) {
    const TrainOptions o = TrainOptions::from_json(R"({"steps": 30, "no-such-flag": [1, 2], "lr": 0.5})");
    EXPECT_EQ(o.steps, 30);
    EXPECT_EQ(o.learning_rate, TrainOptions().learning_rate);  // "lr" is an alias, not a key
    EXPECT_EQ(o.batch_size, TrainOptions().batch_size);
    EXPECT_EQ(TrainOptions::from_json("{}").to_json(), TrainOptions().to_json());
    // integers where floats are: another writer may print 1.0 as 1
    EXPECT_EQ(TrainOptions::from_json(R"({"grad-clip": 2, "comm-timeout": 30})").grad_clip, 2.0f);
}

TEST(OptionsJson, AWrongTypeNamesTheKey) {
    EXPECT_ERROR(TrainOptions::from_json(R"({"batch-size": "8"})"), "\"batch-size\"", "an integer", "\"8\"");
    EXPECT_ERROR(TrainOptions::from_json(R"({"batch-size": 8.5})"), "\"batch-size\"", "an integer");
    EXPECT_ERROR(TrainOptions::from_json(R"({"steps": 3000000000})"), "\"steps\"", "an integer");
    EXPECT_ERROR(TrainOptions::from_json(R"({"seed": -1})"), "\"seed\"", "a non-negative integer");
    EXPECT_ERROR(TrainOptions::from_json(R"({"from-scratch": 1})"), "\"from-scratch\"", "a boolean");
    EXPECT_ERROR(TrainOptions::from_json(R"({"learning-rate": "1e-4"})"), "\"learning-rate\"", "a number");
    EXPECT_ERROR(TrainOptions::from_json(R"({"model-dtype": null})"), "\"model-dtype\"", "a string", "null");
    EXPECT_ERROR(TrainOptions::from_json("[1]"), "options JSON", "an object");
    EXPECT_ERROR(TrainOptions::from_json("{"), "options JSON", "not JSON");
}
