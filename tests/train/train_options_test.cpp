#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "train/train_options.h"

using namespace qtrain;
using qtrain::test::Contains;

namespace {
std::optional<int> parse(std::vector<std::string> args, TrainOptions& o) {
    args.insert(args.begin(), "train");
    std::vector<const char*> argv;
    for (auto& a : args) argv.push_back(a.c_str());
    return parse_train_options(static_cast<int>(argv.size()), argv.data(), o);
}
}  // namespace

TEST(TrainOptions, ParsesFlagsOfTheSeedDesign) {
    TrainOptions o;
    auto r = parse({"--model=Qwen2.5-0.5B", "--from-scratch", "--train-file=a*.bin", "--eval-file=e.bin",
                    "--batch-size=8", "--seq-len=512", "--grad-accumulation=2", "--steps=30", "--learning-rate=1e-3",
                    "--lr-schedule=linear", "--warmup=5", "--cooldown=3", "--final-lr-fraction=0.1",
                    "--weight-decay=0.05", "--grad-clip=0.5", "--beta-1=0.8", "--beta-2=0.99", "--ckpt-interval=10",
                    "--eval-every-n-steps=7", "--eval-num-steps=3", "--out-dir=o", "--checkpoint-dir=c",
                    "--log-file=l.jsonl", "--continue", "--seed=7", "--device=cpu", "--model-dtype=bf16",
                    "--matmul-dtype=e4m3", "--opt-m-dtype=bf16", "--opt-v-dtype=bf16", "--recompute-ffn",
                    "--offload-master", "--zero-level=2", "--gpus=2", "--lmhead-chunks=4", "--memory-limit=24GiB"},
                   o);
    EXPECT_FALSE(r.has_value());
    EXPECT_EQ(o.model, "Qwen2.5-0.5B");
    EXPECT_TRUE(o.from_scratch);
    EXPECT_EQ(o.batch_size, 8);
    EXPECT_EQ(o.seq_len, 512);
    EXPECT_EQ(o.grad_accumulation, 2);
    EXPECT_FLOAT_EQ(o.learning_rate, 1e-3f);
    EXPECT_EQ(o.lr_schedule, "linear");
    EXPECT_EQ(o.warmup_steps(), 5);
    EXPECT_TRUE(o.continue_from_checkpoint);
    EXPECT_EQ(o.seed, 7u);
    EXPECT_EQ(o.log_path(), "l.jsonl");

    ModelOptions m = o.model_options("cuda");
    EXPECT_EQ(m.model_dtype, DType::BF16);
    EXPECT_EQ(m.matmul_dtype, DType::E4M3);
    EXPECT_EQ(m.gradient_dtype, DType::BF16);  // fp8 matmuls default to bf16 gradients
    EXPECT_TRUE(m.recompute_ffn);
    EXPECT_TRUE(m.recompute_swiglu);           // implied by --recompute-ffn
    EXPECT_FALSE(m.recompute_att);
    EXPECT_TRUE(m.shard_gradients);            // zero-level 2
    EXPECT_FALSE(m.shard_weights);
    EXPECT_EQ(m.memory_limit, 24ull << 30);
}

TEST(TrainOptions, DefaultsDependOnDevice) {
    TrainOptions o;
    EXPECT_EQ(o.model_options("cpu").model_dtype, DType::F32);
    EXPECT_EQ(o.model_options("cuda").model_dtype, DType::BF16);
    EXPECT_EQ(o.model_options("cuda").matmul_dtype, DType::BF16);
    o.steps = 30;
    EXPECT_EQ(o.warmup_steps(), 3);  // min(100, steps / 10)
    EXPECT_EQ(o.log_path(), "output/log.jsonl");
}

TEST(TrainOptions, RecomputeBlockImpliesEverything) {
    TrainOptions o;
    o.recompute_block = true;
    ModelOptions m = o.model_options("cuda");
    EXPECT_TRUE(m.recompute_swiglu && m.recompute_norm && m.recompute_qkv && m.recompute_ffn && m.recompute_att);
}

// ZeRO-3 is asked for by --zero-level=3 or --shard-weights; the rank loop picks the level from these
// two model flags (the highest that is set), so level 3 must imply the gradients' sharding too.
TEST(TrainOptions, ZeroLevelThreeAndShardWeightsShardTheWeights) {
    for (const char* flag : {"--zero-level=3", "--shard-weights"}) {
        SCOPED_TRACE(flag);
        TrainOptions o;
        ASSERT_FALSE(parse({"--model=m", "--train-file=t", "--gpus=2", flag}, o).has_value());
        const ModelOptions m = o.model_options("cpu");
        EXPECT_TRUE(m.shard_weights);
        if (std::string(flag) == "--zero-level=3") EXPECT_TRUE(m.shard_gradients);
    }
    TrainOptions two;
    ASSERT_FALSE(parse({"--model=m", "--train-file=t", "--zero-level=2"}, two).has_value());
    EXPECT_FALSE(two.model_options("cpu").shard_weights);
    TrainOptions four;
    EXPECT_TRUE(parse({"--model=m", "--train-file=t", "--zero-level=4"}, four).has_value()) << "1..3 only";
}

TEST(TrainOptions, BadDtypeNamesTheFlag) {
    TrainOptions o;
    o.model_dtype = "fp8";
    try {
        o.model_options("cuda");
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_TRUE(Contains(e.what(), "--model-dtype"));
        EXPECT_TRUE(Contains(e.what(), "fp32|bf16"));
    }
}

TEST(TrainOptions, ValidateNamesTheFlag) {
    auto expect_error = [](auto mutate, const std::string& flag) {
        TrainOptions o;
        o.model = "m";
        o.train_file = "t.bin";
        mutate(o);
        try {
            o.validate();
            ADD_FAILURE() << "expected an error for " << flag;
        } catch (const Error& e) {
            EXPECT_TRUE(Contains(e.what(), flag));
        }
    };
    expect_error([](TrainOptions& o) { o.batch_size = 0; }, "--batch-size");
    expect_error([](TrainOptions& o) { o.seq_len = 1; }, "--seq-len");
    expect_error([](TrainOptions& o) { o.grad_accumulation = 0; }, "--grad-accumulation");
    expect_error([](TrainOptions& o) { o.final_lr_fraction = 2; }, "--final-lr-fraction");
    expect_error([](TrainOptions& o) { o.beta_2 = 1.0f; }, "--beta-2");
    expect_error([](TrainOptions& o) { o.cooldown = 5000; }, "--cooldown");
    expect_error([](TrainOptions& o) { o.memory_limit = "24 parsecs"; }, "--memory-limit");
    expect_error([](TrainOptions& o) { o.model = ""; }, "--model");
    expect_error([](TrainOptions& o) { o.train_file = ""; }, "--train-file");
}

TEST(TrainOptions, UnknownFlagIsAParseError) {
    TrainOptions o;
    testing::internal::CaptureStderr();
    testing::internal::CaptureStdout();
    auto r = parse({"--no-such-flag=1"}, o);
    testing::internal::GetCapturedStdout();
    std::string err = testing::internal::GetCapturedStderr();
    ASSERT_TRUE(r.has_value());
    EXPECT_NE(*r, 0);
}

TEST(TrainOptions, ToJsonHasEveryFlag) {
    TrainOptions o;
    auto j = nlohmann::json::parse(o.to_json());
    for (const char* key : {"model", "from-scratch", "train-file", "eval-file", "model-dtype", "matmul-dtype",
                            "gradient-dtype", "opt-m-dtype", "opt-v-dtype", "recompute-swiglu", "recompute-norm",
                            "recompute-qkv", "recompute-ffn", "recompute-att", "recompute-block", "offload-residual",
                            "offload-master", "offload-opt-m", "offload-opt-v", "offload-quants", "offload-gradients",
                            "shard-weights", "shard-gradients", "zero-level", "persistent-quants", "write-combined",
                            "memcpy-all-gather", "use-cuda-graphs", "lmhead-chunks", "attn-bwd-chunks", "gpus",
                            "batch-size", "seq-len", "grad-accumulation", "steps", "learning-rate", "lr-schedule",
                            "warmup", "cooldown", "final-lr-fraction", "weight-decay", "grad-clip", "beta-1", "beta-2",
                            "ckpt-interval", "eval-every-n-steps", "eval-num-steps", "out-dir", "checkpoint-dir",
                            "log-file", "continue", "seed", "device", "plan-only", "memory-limit", "master-dtype"})
        EXPECT_TRUE(j.contains(key)) << key;
}

TEST(TrainOptions, CkptKeepParsesValidatesAndIsRecorded) {
    TrainOptions o;
    EXPECT_EQ(o.ckpt_keep, 0);  // keep all
    EXPECT_FALSE(parse({"--ckpt-keep=3"}, o).has_value());
    EXPECT_EQ(o.ckpt_keep, 3);
    EXPECT_EQ(nlohmann::json::parse(o.to_json())["ckpt-keep"], 3);
    o.model = "m";
    o.train_file = "t.bin";
    o.ckpt_keep = -1;
    EXPECT_ERROR(o.validate(), "--ckpt-keep", "-1");
}

// The flags from a list (the Python package's path): the same options as the command line, and its
// messages as exceptions instead of printed text and exit codes.
TEST(TrainOptions, FromArgsParsesAsTheCommandLineAndThrowsItsMessages) {
    const TrainOptions o = train_options_from_args({"--steps=7", "--learning-rate=0.001", "--from-scratch",
                                                    "--zero-level=3", "--steps=9"});
    EXPECT_EQ(o.steps, 9);  // the last of a repeated flag, as on the command line
    EXPECT_FLOAT_EQ(o.learning_rate, 0.001f);
    EXPECT_TRUE(o.from_scratch);
    EXPECT_EQ(o.zero_level, 3);
    auto message = [](const std::vector<std::string>& args) {
        try {
            train_options_from_args(args);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_NE(message({"--zero-level=4"}).find("--zero-level"), std::string::npos);
    EXPECT_NE(message({"--no-such-flag=1"}).find("--no-such-flag"), std::string::npos);
    EXPECT_NE(message({"--checkpoint-dir="}).find("--checkpoint-dir has an empty value"), std::string::npos);
    EXPECT_NE(message({"--help"}).find("--learning-rate"), std::string::npos);  // the help text
}
