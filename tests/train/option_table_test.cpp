// The option table (src/train/option_table.h): its resume rules are the ones resume_check.cpp had
// as hand-written sets, the CLI registers its checks, and describe_train_options() (the Python
// package's view) covers every flag --help lists.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <variant>

#include "test_util.h"
#include "train/option_info.h"
#include "train/option_table.h"
#include "train/train_options.h"

using namespace qtrain;
using Names = std::set<std::string>;

namespace {

Names with_rule(ResumeRule rule) {
    Names out;
    for (const OptionSpec& spec : train_option_table())
        if (spec.resume == rule) out.insert(spec.name);
    return out;
}

std::string help_text() {
    try {
        train_options_from_args({"--help"});
    } catch (const Error& e) {
        return e.what();
    }
    ADD_FAILURE() << "--help did not stop";
    return {};
}

}  // namespace

// The sets resume_check.cpp listed by hand before the table (commit 8e2747d), copied verbatim.
TEST(OptionTable, ResumeRulesAreTheOldHandWrittenSets) {
    const Names kMayChange = {
        "model", "from-scratch", "device", "steps", "eval-file", "eval-every-n-steps", "eval-num-steps",
        "ckpt-interval", "ckpt-keep", "checkpoint-dir", "out-dir", "log-file", "tokenizer", "memory-limit",
        "host-memory-limit", "recompute-swiglu", "recompute-norm", "recompute-qkv", "recompute-ffn", "recompute-att",
        "recompute-block", "offload-residual", "offload-master", "offload-opt-m", "offload-opt-v", "offload-quants",
        "offload-gradients", "offload-double-buffer", "persistent-quants", "write-combined", "memcpy-all-gather",
        "shard-weights", "shard-gradients", "zero-level", "comm-timeout", "rendezvous-timeout", "gpu-ids", "use-cuda-graphs", "lmhead-chunks", "attn-bwd-chunks",
        "attention", "gemm-autotune", "lora-from", "merge-lora",
        "max-docs-per-row",        // added since (issue 31: cuDNN's ragged attention)
        "fp8-weight-transposes"};  // issue 32: bit-identical, and no checkpoint holds the transposed copies
    const Names kInvocation = {"continue", "overwrite", "force-resume", "plan-only"};
    const Names kResolved = {"model-dtype", "matmul-dtype", "gradient-dtype", "warmup"};
    EXPECT_EQ(with_rule(ResumeRule::MayChange), kMayChange);
    EXPECT_EQ(with_rule(ResumeRule::Invocation), kInvocation);
    EXPECT_EQ(with_rule(ResumeRule::Resolved), kResolved);
    // every other recorded flag had to match; --export-checkpoint was never recorded
    EXPECT_EQ(with_rule(ResumeRule::NotRecorded), Names{"export-checkpoint"});
    const Names kMustMatch = {
        "train-file", "batch-size", "seq-len", "opt-m-dtype", "opt-v-dtype", "master-dtype", "param-grad-dtype",
        "gpus", "fp8-fast-accum", "grad-accumulation", "learning-rate", "lr-schedule", "cooldown",
        "final-lr-fraction", "weight-decay", "grad-clip", "beta-1", "beta-2", "adam-epsilon", "seed",
        // added since (issue 31): they change the data and the math
        "document-masking", "loss-normalization", "packing",
        // issue 33: LoRA changes what is trained
        "lora-rank", "lora-alpha", "lora-dropout", "lora-targets", "lora-init", "train-also",
        // issue 32: the FP8 LM head changes the numerics
        "lm-head-dtype"};
    EXPECT_EQ(with_rule(ResumeRule::MustMatch), kMustMatch);
    for (const OptionSpec& spec : train_option_table())
        EXPECT_NE(std::string(resume_rule_name(spec.resume)), "?") << spec.name << " has no resume rule";
}

TEST(OptionTable, FindsByNameNotByAlias) {
    ASSERT_NE(find_train_option("batch-size"), nullptr);
    EXPECT_EQ(find_train_option("batch-size")->aliases, std::vector<std::string>{"batch"});
    EXPECT_EQ(find_train_option("batch"), nullptr);
    EXPECT_EQ(find_train_option("--batch-size"), nullptr);
    EXPECT_EQ(find_train_option("help"), nullptr);
}

// The CLI checks come from the table: each choice is taken, anything else refused naming the flag.
TEST(OptionTable, TheCliAppliesTheTablesChecks) {
    for (const OptionSpec& spec : train_option_table()) {
        for (const std::string& choice : spec.check.choices)
            EXPECT_NO_THROW(train_options_from_args({"--" + spec.name + "=" + choice})) << spec.name;
        if (!spec.check.choices.empty())
            EXPECT_ERROR(train_options_from_args({"--" + spec.name + "=no-such-value"}), "--" + spec.name);
    }
    EXPECT_EQ(train_options_from_args({"--zero-level=3"}).zero_level, 3);
    EXPECT_ERROR(train_options_from_args({"--zero-level=0"}), "--zero-level");
    EXPECT_EQ(train_options_from_args({"--comm-timeout=0"}).comm_timeout, 0.0);
    EXPECT_ERROR(train_options_from_args({"--comm-timeout=-1"}), "--comm-timeout");
    EXPECT_EQ(train_options_from_args({"--rendezvous-timeout=2.5"}).rendezvous_timeout, 2.5);
    EXPECT_EQ(train_options_from_args({"--rendezvous-timeout=0"}).rendezvous_timeout, 0.0);
    EXPECT_ERROR(train_options_from_args({"--rendezvous-timeout=-1"}), "--rendezvous-timeout");
    // the aliases
    EXPECT_EQ(train_options_from_args({"--batch=16"}).batch_size, 16);
    EXPECT_FLOAT_EQ(train_options_from_args({"--lr=0.5"}).learning_rate, 0.5f);
}

TEST(OptionTable, DescribeCoversEveryFlagOfHelp) {
    const std::vector<OptionInfo> infos = describe_train_options();
    ASSERT_EQ(infos.size(), train_option_table().size());
    Names described, keywords;
    std::map<std::string, OptionInfo> by_flag;
    for (const OptionInfo& info : infos) {
        described.insert(info.flag);
        for (const std::string& a : info.aliases) described.insert(a);
        EXPECT_TRUE(keywords.insert(info.python).second) << info.python << " twice";
        EXPECT_TRUE(std::regex_match(info.python, std::regex("[a-z][a-z0-9_]*"))) << info.python;
        EXPECT_TRUE(info.type == "bool" || info.type == "int" || info.type == "float" || info.type == "string")
            << info.flag << ": " << info.type;
        EXPECT_FALSE(info.help.empty()) << info.flag;
        EXPECT_FALSE(info.group.empty()) << info.flag;
        by_flag[info.flag] = info;
    }
    // every --flag that --help shows, in the option column or in a description, is described
    const std::string help = help_text();
    const std::regex flag(R"(--([a-z][a-z0-9-]+))");
    Names in_help;
    for (auto it = std::sregex_iterator(help.begin(), help.end(), flag); it != std::sregex_iterator(); ++it)
        in_help.insert((*it)[1].str());
    in_help.erase("help");  // CLI11's own
    EXPECT_GT(in_help.size(), 50u);
    for (const std::string& f : in_help) EXPECT_TRUE(described.count(f)) << "--" << f << " is not described";
    for (const std::string& f : described) EXPECT_TRUE(in_help.count(f)) << "--" << f << " is not in --help";

    // a few by hand
    EXPECT_EQ(by_flag["learning-rate"].python, "learning_rate");
    EXPECT_EQ(by_flag["learning-rate"].type, "float");
    EXPECT_EQ(by_flag["learning-rate"].default_value, "1e-05");
    EXPECT_EQ(by_flag["learning-rate"].resume, "must-match");
    EXPECT_EQ(by_flag["batch-size"].type, "int");
    EXPECT_EQ(by_flag["batch-size"].default_value, "4");
    EXPECT_EQ(by_flag["batch-size"].group, "Data");
    EXPECT_EQ(by_flag["from-scratch"].type, "bool");
    EXPECT_EQ(by_flag["from-scratch"].default_value, "false");
    EXPECT_EQ(by_flag["device"].choices, (std::vector<std::string>{"auto", "cpu", "cuda"}));
    EXPECT_EQ(by_flag["device"].default_value, "auto");
    EXPECT_EQ(by_flag["model-dtype"].default_value, "");
    EXPECT_EQ(by_flag["seed"].type, "int");
    EXPECT_EQ(by_flag["seed"].default_value, "42");
    EXPECT_EQ(by_flag["comm-timeout"].default_value, "600");
    EXPECT_EQ(by_flag["rendezvous-timeout"].default_value, "600");  // torchrun's rendezvous default
    EXPECT_EQ(by_flag["rendezvous-timeout"].resume, "may-change");
    EXPECT_EQ(by_flag["beta-2"].default_value, "0.95");
    EXPECT_EQ(by_flag["continue"].python, "continue_from_checkpoint");  // `continue` is a Python keyword
    EXPECT_EQ(by_flag["continue"].resume, "invocation");
    EXPECT_EQ(by_flag["steps"].resume, "may-change");
    EXPECT_EQ(by_flag["warmup"].resume, "resolved");
    EXPECT_EQ(by_flag["export-checkpoint"].resume, "not-recorded");
}

// What the model is given comes from the entries (TrainOptions::model_options): the flags that fill a
// ModelOptions field are the ones the hand-written copy listed (commit 3e79bfc), and each of them,
// given, changes the model's options; no other flag does.
TEST(OptionTable, TheModelReadsTheFlagsTheHandWrittenCopyDid) {
    const Names kToModel = {
        "batch-size", "seq-len", "model-dtype", "matmul-dtype", "gradient-dtype", "opt-m-dtype", "opt-v-dtype",
        "master-dtype", "param-grad-dtype", "recompute-swiglu", "recompute-norm", "recompute-qkv", "recompute-ffn",
        "recompute-att", "recompute-block", "offload-residual", "offload-master", "offload-opt-m", "offload-opt-v",
        "offload-quants", "offload-gradients", "persistent-quants", "offload-double-buffer", "write-combined",
        "memcpy-all-gather", "gpus", "shard-weights", "shard-gradients", "use-cuda-graphs", "lmhead-chunks",
        "attn-bwd-chunks", "attention", "fp8-fast-accum", "gemm-autotune", "memory-limit",
        "document-masking",  // added since (issue 31); its auto is resolved on the train files
        "lora-rank", "lora-from", "merge-lora",  // issue 33: ModelOptions::lora
        "lm-head-dtype",                         // issue 32: ModelOptions::fp8_lm_head
        "max-docs-per-row",                      // issue 31: cuDNN's ragged attention
        "fp8-weight-transposes"};                // issue 32: ModelOptions::fp8_transposes_jit
    Names to_model;
    for (const OptionSpec& spec : train_option_table())
        if (spec.to_model) to_model.insert(spec.name);
    EXPECT_EQ(to_model, kToModel);
    // a value other than the default, per flag that has one the model can take
    const std::map<std::string, std::string> kValue = {
        {"batch-size", "8"},        {"seq-len", "64"},          {"model-dtype", "fp32"},   {"matmul-dtype", "e4m3"},
        {"gradient-dtype", "e5m2"}, {"opt-m-dtype", "bf16"},    {"opt-v-dtype", "bf16"},   {"master-dtype", "bf16"},
        {"param-grad-dtype", "bf16"}, {"gpus", "2"},            {"zero-level", "2"},       {"lmhead-chunks", "2"},
        {"attn-bwd-chunks", "2"},   {"attention", "flash"},     {"fp8-fast-accum", "all"}, {"memory-limit", "1GiB"},
        {"document-masking", "on"}, {"lora-rank", "4"},        {"lm-head-dtype", "e4m3"},
        {"max-docs-per-row", "8"},  {"fp8-weight-transposes", "jit"}};
    const ModelOptions base = TrainOptions().model_options("cuda");
    for (const OptionSpec& spec : train_option_table()) {
        const bool is_bool = std::holds_alternative<bool TrainOptions::*>(spec.member);
        if (!is_bool && !kValue.count(spec.name)) continue;
        const std::string arg = "--" + spec.name + (is_bool ? "" : "=" + kValue.at(spec.name));
        const bool changes = train_options_from_args({arg}).model_options("cuda") != base;
        // --zero-level reaches the model through what it implies (model_options.h, zero_level)
        EXPECT_EQ(changes, spec.to_model != nullptr || !spec.implies.empty()) << arg;
    }
}

// The implications, against the hand-written formulas they replaced, over every combination.
TEST(OptionTable, ImplicationsAreTheHandWrittenOnes) {
    for (int bits = 0; bits < 64; ++bits) {
        TrainOptions o;
        o.recompute_swiglu = bits & 1, o.recompute_norm = bits & 2, o.recompute_qkv = bits & 4;
        o.recompute_ffn = bits & 8, o.recompute_att = bits & 16, o.recompute_block = bits & 32;
        const ModelOptions m = o.model_options("cuda");
        const bool ffn = o.recompute_ffn || o.recompute_block, att = o.recompute_att || o.recompute_block;
        EXPECT_EQ(m.recompute_block, o.recompute_block) << bits;
        EXPECT_EQ(m.recompute_ffn, ffn) << bits;
        EXPECT_EQ(m.recompute_att, att) << bits;
        EXPECT_EQ(m.recompute_swiglu, o.recompute_swiglu || ffn) << bits;
        EXPECT_EQ(m.recompute_qkv, o.recompute_qkv || att) << bits;
        EXPECT_EQ(m.recompute_norm, o.recompute_norm || o.recompute_block) << bits;
    }
    for (int gpus : {1, 2})
        for (int zero : {1, 2, 3})
            for (bool weights : {false, true})
                for (bool gradients : {false, true}) {
                    SCOPED_TRACE(cat("gpus ", gpus, " zero ", zero, " weights ", weights, " gradients ", gradients));
                    TrainOptions o;
                    o.gpus = gpus, o.zero_level = zero, o.shard_weights = weights, o.shard_gradients = gradients;
                    const ModelOptions m = o.model_options("cuda");
                    const bool w = weights || zero >= 3;
                    EXPECT_EQ(m.shard_weights, w);
                    EXPECT_EQ(m.shard_gradients, gradients || zero >= 2 || (w && gpus > 1));
                    if (gpus > 1) EXPECT_EQ(static_cast<int>(zero_level(m)), w ? 3 : std::max(zero, gradients ? 2 : 1));
                }
}
