// --lm-head-dtype (issue 32): the flag reaches the model, e4m3 is refused without FP8 matmuls on
// both devices (naming both flags), and the GPU memory plan counts the FP8 LM head's buffers
// (works without a GPU: the plan is measured, not allocated).
#include <gtest/gtest.h>

#include <string>

#include "backends/model_backends.h"
#include "model/memory_plan.h"
#include "model/model_config.h"
#include "plan_category.h"
#include "test_util.h"
#include "train/train_options.h"

namespace qtrain {
namespace {

using test::category;

TEST(LmHeadDtype, ReachesTheModelOptionsOffByDefault) {
    EXPECT_FALSE(TrainOptions().model_options("cuda").fp8_lm_head);
    EXPECT_FALSE(train_options_from_args({"--lm-head-dtype=bf16", "--matmul-dtype=e4m3"}).model_options("cuda").fp8_lm_head);
    EXPECT_TRUE(train_options_from_args({"--lm-head-dtype=e4m3", "--matmul-dtype=e4m3"}).model_options("cuda").fp8_lm_head);
    EXPECT_ERROR(train_options_from_args({"--lm-head-dtype=e5m2"}), "--lm-head-dtype");
    EXPECT_ERROR(train_options_from_args({"--lm-head-dtype=fp32"}), "--lm-head-dtype");
}

TEST(LmHeadDtype, E4m3NeedsFp8MatmulsOnBothDevices) {
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    TrainOptions t;
    t.batch_size = 2;
    t.seq_len = 256;
    t.lm_head_dtype = "e4m3";
    EXPECT_ERROR(plan_model(cfg, t.model_options("cpu"), "cpu"), "--lm-head-dtype=e4m3", "--matmul-dtype=e4m3");
    TrainOptions cpu = t;
    cpu.matmul_dtype = "e4m3";  // the CPU model emulates it
    EXPECT_NO_THROW(plan_model(cfg, cpu.model_options("cpu"), "cpu"));
#ifdef QTRAIN_HAVE_CUDA
    EXPECT_ERROR(plan_model(cfg, t.model_options("cuda"), "cuda"), "--lm-head-dtype=e4m3", "--matmul-dtype=e4m3");
    TrainOptions g = t;
    g.matmul_dtype = "e4m3";
    EXPECT_NO_THROW(plan_model(cfg, g.model_options("cuda"), "cuda"));
    g.gradient_dtype = "e5m2";
    EXPECT_NO_THROW(plan_model(cfg, g.model_options("cuda"), "cuda"));
#endif
}

#ifdef QTRAIN_HAVE_CUDA
// With FP8 gradients one chunk's d(logits) is kept in FP8 twice (row-major and transposed: 2 bytes
// per logit of a chunk, in the workspace); streamed weights add the resident head's FP8 copies
// (V x h bytes each, in the quants); resident weights already have room for them in the flat FP8
// copies. Without FP8 gradients only six 16-byte scale slots are added.
TEST(LmHeadDtype, GpuPlanCountsTheFp8HeadBuffers) {
    const ModelConfig cfg = preset_config("Llama-3.2-1B");
    const uint64_t V = cfg.vocab_size, h = cfg.hidden_size;
    TrainOptions t;
    t.batch_size = 4;
    t.seq_len = 1024;
    t.lmhead_chunks = 2;
    t.matmul_dtype = "e4m3";
    const uint64_t rows = 4 * 1024 / 2;
    auto plans = [&](TrainOptions o) {
        const MemoryPlan off = plan_model(cfg, o.model_options("cuda"), "cuda");
        o.lm_head_dtype = "e4m3";
        return std::pair{off, plan_model(cfg, o.model_options("cuda"), "cuda")};
    };
    {
        SCOPED_TRACE("bf16 gradients, resident");
        const auto [off, on] = plans(t);
        EXPECT_EQ(category(on, "Quants"), category(off, "Quants"));
        EXPECT_GE(category(on, "Workspace"), category(off, "Workspace"));
        EXPECT_LE(category(on, "Workspace"), category(off, "Workspace") + 512);
    }
    t.gradient_dtype = "e5m2";
    {
        SCOPED_TRACE("e5m2 gradients, resident");
        const auto [off, on] = plans(t);
        EXPECT_EQ(category(on, "Quants"), category(off, "Quants"));
        EXPECT_GE(category(on, "Workspace"), category(off, "Workspace") + 2 * rows * V);
        EXPECT_LE(category(on, "Workspace"), category(off, "Workspace") + 2 * rows * V + 1024);
    }
    t.shard_weights = true;
    {
        SCOPED_TRACE("e5m2 gradients, streamed weights");
        const auto [off, on] = plans(t);
        EXPECT_GE(category(on, "Quants"), category(off, "Quants") + 2 * V * h);
        EXPECT_LE(category(on, "Quants"), category(off, "Quants") + 2 * V * h + 512);
        EXPECT_GE(category(on, "Workspace"), category(off, "Workspace") + 2 * rows * V);
    }
}
#endif

}  // namespace
}  // namespace qtrain
