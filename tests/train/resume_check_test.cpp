// --continue resumes the same run: which option changes are refused (they change the math or the
// data), which are allowed, and how device-dependent defaults are compared.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "model/model_config.h"
#include "test_util.h"
#include "train/resume_check.h"
#include "train/train_options.h"

using namespace qtrain;
using qtrain::test::Contains;

namespace {

ModelConfig config() {
    ModelConfig c = preset_config("Qwen2.5-0.5B");
    c.rope_theta = 500000.0;
    return c;
}

TrainOptions base() {
    TrainOptions o;
    o.model = "some/dir";
    o.train_file = "data/train*.bin";
    o.batch_size = 8;
    o.steps = 200;
    o.learning_rate = 6e-4f;
    return o;
}

std::vector<OptionChange> compare(const TrainOptions& before, const std::string& before_device,
                                  const TrainOptions& now, const std::string& device,
                                  const ModelConfig& now_config = config()) {
    return compare_resume_options(before.to_json(), before_device, model_config_to_json(config()), now, device,
                                  now_config);
}

const OptionChange* find(const std::vector<OptionChange>& changes, const std::string& flag) {
    auto it = std::find_if(changes.begin(), changes.end(), [&](const OptionChange& c) { return c.flag == flag; });
    return it == changes.end() ? nullptr : &*it;
}

}  // namespace

TEST(ResumeCheck, TheSameOptionsAreTheSameRun) {
    EXPECT_TRUE(compare(base(), "cpu", base(), "cpu").empty());
}

TEST(ResumeCheck, OptionsThatChangeTheMathOrTheDataAreRefused) {
    struct Case {
        const char* flag;
        void (*change)(TrainOptions&);
    };
    const Case cases[] = {
        {"--batch-size", [](TrainOptions& o) { o.batch_size = 16; }},
        {"--seq-len", [](TrainOptions& o) { o.seq_len = 512; }},
        {"--grad-accumulation", [](TrainOptions& o) { o.grad_accumulation = 8; }},
        {"--seed", [](TrainOptions& o) { o.seed = 7; }},
        {"--train-file", [](TrainOptions& o) { o.train_file = "other/*.bin"; }},
        {"--learning-rate", [](TrainOptions& o) { o.learning_rate = 3e-4f; }},
        {"--lr-schedule", [](TrainOptions& o) { o.lr_schedule = "linear"; }},
        {"--final-lr-fraction", [](TrainOptions& o) { o.final_lr_fraction = 0.1f; }},
        {"--cooldown", [](TrainOptions& o) { o.cooldown = 10; }},
        {"--weight-decay", [](TrainOptions& o) { o.weight_decay = 0.0f; }},
        {"--grad-clip", [](TrainOptions& o) { o.grad_clip = 0.5f; }},
        {"--beta-2", [](TrainOptions& o) { o.beta_2 = 0.999f; }},
        {"--opt-m-dtype", [](TrainOptions& o) { o.opt_m_dtype = "bf16"; }},
        {"--matmul-dtype", [](TrainOptions& o) { o.matmul_dtype = "e4m3"; }},
        {"--fp8-fast-accum", [](TrainOptions& o) { o.fp8_fast_accum = "all"; }},
    };
    for (const Case& c : cases) {
        TrainOptions now = base();
        c.change(now);
        const auto changes = compare(base(), "cuda", now, "cuda");
        const OptionChange* found = find(changes, c.flag);
        ASSERT_NE(found, nullptr) << c.flag << " was not reported";
        EXPECT_TRUE(found->changes_run) << c.flag;
        EXPECT_EQ(changes.size(), 1u) << c.flag;
    }
    EXPECT_TRUE(Contains(describe_option_change(*find(
                             [] {
                                 TrainOptions now = base();
                                 now.batch_size = 16;
                                 return compare(base(), "cpu", now, "cpu");
                             }(),
                             "--batch-size")),
                         "--batch-size: 8 in the checkpoint, 16 now"));
}

TEST(ResumeCheck, PathsIntervalsStepsAndMemoryFlagsMayChange) {
    TrainOptions now = base();
    now.steps = 400;
    now.warmup = base().warmup_steps();  // the default warmup depends on --steps: keep it
    now.out_dir = "elsewhere";
    now.ckpt_interval = 50;
    now.eval_every_n_steps = 10;
    now.recompute_block = true;
    now.offload_opt_m = true;
    now.use_cuda_graphs = true;
    now.lmhead_chunks = 8;
    now.fp8_weight_transposes = "jit";  // bit-identical, and no checkpoint holds the transposed FP8 copies
    now.model = "moved/dir";
    const auto changes = compare(base(), "cuda", now, "cuda");
    for (const auto& c : changes) EXPECT_FALSE(c.changes_run) << describe_option_change(c);
    const OptionChange* steps = find(changes, "--steps");
    ASSERT_NE(steps, nullptr);
    EXPECT_TRUE(Contains(steps->note, "schedule is recomputed over 400 steps")) << steps->note;
}

// --fp8-weight-transposes changes where Wᵀ comes from, not its bytes (and a checkpoint holds no FP8
// copy): either way round it may change on --continue of an FP8-gradient run (listed, not refused).
TEST(ResumeCheck, Fp8WeightTransposesMayChangeBothWays) {
    TrainOptions kept = base();
    kept.matmul_dtype = "e4m3";
    kept.gradient_dtype = "e5m2";
    TrainOptions jit = kept;
    jit.fp8_weight_transposes = "jit";
    for (const auto& [before, now] : {std::pair{kept, jit}, std::pair{jit, kept}}) {
        const auto changes = compare(before, "cuda", now, "cuda");
        const OptionChange* c = find(changes, "--fp8-weight-transposes");
        ASSERT_NE(c, nullptr);
        EXPECT_FALSE(c->changes_run) << describe_option_change(*c);
        for (const auto& other : changes) EXPECT_FALSE(other.changes_run) << describe_option_change(other);
    }
}

// --warmup defaults to min(100, --steps/10): extending a run of 200 steps to 2000 would move the end
// of the warmup from step 20 to step 100, so the resolved values are compared.
TEST(ResumeCheck, ADefaultWarmupThatMovesWithStepsIsRefused) {
    TrainOptions now = base();
    now.steps = 2000;
    const OptionChange* w = find(compare(base(), "cpu", now, "cpu"), "--warmup");
    ASSERT_NE(w, nullptr);
    EXPECT_TRUE(w->changes_run);
    EXPECT_TRUE(Contains(w->note, "--warmup=20")) << w->note;
}

// "" dtypes mean the device's default: fp32 on the CPU, bf16 on the GPU.
TEST(ResumeCheck, DeviceDefaultDtypesAreComparedResolved) {
    const auto changes = compare(base(), "cpu", base(), "cuda");
    const OptionChange* dt = find(changes, "--model-dtype");
    ASSERT_NE(dt, nullptr);
    EXPECT_TRUE(dt->changes_run);
    EXPECT_EQ(dt->before, "fp32");
    EXPECT_EQ(dt->after, "bf16");
    EXPECT_TRUE(Contains(dt->note, "--model-dtype=fp32")) << dt->note;
    const OptionChange* dev = find(changes, "--device");
    ASSERT_NE(dev, nullptr);
    EXPECT_FALSE(dev->changes_run);
    // with the dtypes given explicitly, the device alone may change
    TrainOptions fp32 = base();
    fp32.model_dtype = "fp32";
    for (const auto& c : compare(fp32, "cpu", fp32, "cuda")) EXPECT_FALSE(c.changes_run) << describe_option_change(c);
}

TEST(ResumeCheck, AnotherModelIsRefusedByItsConfig) {
    ModelConfig other = config();
    other.rope_theta = 1000000.0;
    const auto changes = compare(base(), "cpu", base(), "cpu", other);
    const OptionChange* c = find(changes, "model config.rope_theta");
    ASSERT_NE(c, nullptr);
    EXPECT_TRUE(c->changes_run);
}

// The recorded options are read back by TrainOptions::from_json: a checkpoint without a newer flag
// compares the rest, a value of the wrong type is an error naming it (not silently the default).
TEST(ResumeCheck, RecordedOptionsAreReadByTheOptionTable) {
    nlohmann::json old = nlohmann::json::parse(base().to_json());
    old.erase("gemm-autotune");
    EXPECT_TRUE(compare_resume_options(old.dump(), "cpu", model_config_to_json(config()), base(), "cpu", config())
                    .empty());
    old["warmup"] = "20";
    EXPECT_ERROR(compare_resume_options(old.dump(), "cpu", model_config_to_json(config()), base(), "cpu", config()),
                 "\"warmup\"", "an integer");
}
