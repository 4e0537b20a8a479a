// The --lora-* flags (issue 33): what the model is told, and the errors that name flag and value.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/model_backends.h"
#include "core/error.h"
#include "model/model_config.h"
#include "test_util.h"
#include "train/train_options.h"

namespace qtrain {
namespace {

std::string validate_message(const std::vector<std::string>& args) {
    try {
        TrainOptions o = train_options_from_args(args);
        o.model = "m";
        o.train_file = "t.bin";
        o.validate();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(LoraOptions, FlagsReachTheModel) {
    const TrainOptions o = train_options_from_args(
        {"--lora-rank=16", "--lora-alpha=32", "--lora-targets=q,v,down", "--lora-init=gaussian", "--seed=7"});
    const ModelOptions m = o.model_options("cpu");
    EXPECT_EQ(m.lora.rank, 16);
    EXPECT_FLOAT_EQ(m.lora.alpha, 32.0f);
    EXPECT_FLOAT_EQ(m.lora.scale(), 2.0f);
    EXPECT_TRUE(m.lora.has(LoraTarget::Q) && m.lora.has(LoraTarget::V) && m.lora.has(LoraTarget::Down));
    EXPECT_FALSE(m.lora.has(LoraTarget::K) || m.lora.has(LoraTarget::O) || m.lora.has(LoraTarget::Gate) ||
                 m.lora.has(LoraTarget::Up));
    EXPECT_EQ(lora_targets_text(m.lora.targets), "q,v,down");
    EXPECT_EQ(m.lora.init, "gaussian");
    EXPECT_EQ(m.lora.seed, 7u);
    // the defaults: off, PEFT's alpha 8, every target
    const ModelOptions d = TrainOptions().model_options("cpu");
    EXPECT_FALSE(d.lora.enabled());
    EXPECT_FLOAT_EQ(d.lora.alpha, 8.0f);
    EXPECT_EQ(lora_targets_text(d.lora.targets), "q,k,v,o,gate,up,down");
    EXPECT_EQ(validate_message({"--lora-rank=8"}), "");
}

TEST(LoraOptions, BadValuesNameFlagAndValue) {
    const std::string unknown = validate_message({"--lora-rank=4", "--lora-targets=q,qkv"});
    EXPECT_NE(unknown.find("--lora-targets=q,qkv"), std::string::npos) << unknown;
    EXPECT_NE(unknown.find("'qkv'"), std::string::npos) << unknown;
    for (const std::string flag : {"--lora-alpha=16", "--lora-targets=q", "--lora-init=gaussian", "--lora-dropout=0.1"}) {
        const std::string m = validate_message({flag});
        EXPECT_NE(m.find(flag.substr(0, flag.find('=')) + " needs --lora-rank > 0"), std::string::npos) << m;
    }
    EXPECT_EQ(validate_message({"--lora-rank=4", "--lora-dropout=0.1"}), "");
    const std::string dropout = validate_message({"--lora-rank=4", "--lora-dropout=1"});
    EXPECT_NE(dropout.find("--lora-dropout must be in [0, 1)"), std::string::npos) << dropout;
    EXPECT_NE(validate_message({"--lora-rank=4", "--lora-alpha=0"}).find("--lora-alpha"), std::string::npos);
    EXPECT_NE(validate_message({"--lora-rank=-1"}).find("--lora-rank"), std::string::npos);
    EXPECT_NE(validate_message({"--lora-rank=4", "--lora-init=pissa"}).find("--lora-init"), std::string::npos);
}

// The GPU model has no LoRA yet: the engine refuses before building it (also in a build without CUDA).
TEST(LoraOptions, CudaRefusesLoraNamingTheFlag) {
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    const ModelOptions m = train_options_from_args({"--lora-rank=8"}).model_options("cuda");
    EXPECT_ERROR(plan_model(cfg, m, "cuda"), "--lora-rank=8", "not yet on --device=cuda");
    EXPECT_ERROR(create_model(cfg, m, "cuda"), "--lora-rank=8", "not yet on --device=cuda");
    // and the CPU plan shows the frozen base
    bool adapters = false;
    for (const auto& e : plan_model(cfg, train_options_from_args({"--lora-rank=8", "--seq-len=16", "--batch-size=1"})
                                              .model_options("cpu"),
                                    "cpu")
                             .entries)
        adapters |= e.category == "LoRA adapters";
    EXPECT_TRUE(adapters);
}

}  // namespace
}  // namespace qtrain
