// --fp8-weight-transposes (issue 32): the flag reaches the model (kept by default), jit is refused where
// there are no kept transposes to drop (bf16 gradients, the CPU model) naming the flags, the GPU memory
// plan drops the transposed e4m3 copies and adds one scratch matrix (works without a GPU: the plan is
// measured, not allocated), and the memory ladder suggests it first. The bytes are computed here from
// the layout and the arena rule (every piece starts 256-byte aligned), not copied from a run.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "backends/model_backends.h"
#include "model/memory_plan.h"
#include "model/model_config.h"
#include "plan_category.h"
#include "test_util.h"
#include "train/memory_fit.h"
#include "train/train_options.h"
#ifdef QTRAIN_HAVE_CUDA
#include "model/cuda/gpu_layout.h"
#endif

namespace qtrain {
namespace {

using test::category;
using test::has_category;

uint64_t aligned(uint64_t bytes) { return (bytes + 255) / 256 * 256; }

TrainOptions fp8(const char* gradient = "e5m2") {
    TrainOptions t;
    t.batch_size = 4;
    t.seq_len = 256;
    t.matmul_dtype = "e4m3";
    t.gradient_dtype = gradient;
    return t;
}

TEST(Fp8WeightTransposes, ReachesTheModelOptionsKeptByDefault) {
    EXPECT_EQ(TrainOptions().fp8_weight_transposes, "kept");
    EXPECT_FALSE(TrainOptions().model_options("cuda").fp8_transposes_jit);
    EXPECT_FALSE(train_options_from_args({"--fp8-weight-transposes=kept"}).model_options("cuda").fp8_transposes_jit);
    EXPECT_TRUE(train_options_from_args({"--fp8-weight-transposes=jit", "--matmul-dtype=e4m3", "--gradient-dtype=e4m3"})
                    .model_options("cuda")
                    .fp8_transposes_jit);
    EXPECT_ERROR(train_options_from_args({"--fp8-weight-transposes=yes"}), "--fp8-weight-transposes");
    EXPECT_ERROR(train_options_from_args({"--fp8-weight-transposes=JIT"}), "--fp8-weight-transposes");
}

TEST(Fp8WeightTransposes, JitIsRefusedWithoutFp8GradientsAndOnTheCpu) {
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    TrainOptions cpu = fp8();
    cpu.fp8_weight_transposes = "jit";
    EXPECT_ERROR(plan_model(cfg, cpu.model_options("cpu"), "cpu"), "--fp8-weight-transposes", "--device=cpu");
#ifdef QTRAIN_HAVE_CUDA
    TrainOptions bf16_grads = fp8("bf16");
    bf16_grads.fp8_weight_transposes = "jit";
    EXPECT_ERROR(plan_model(cfg, bf16_grads.model_options("cuda"), "cuda"), "--fp8-weight-transposes=jit",
                 "--matmul-dtype=e4m3", "--gradient-dtype=e4m3|e5m2");
    TrainOptions bf16 = bf16_grads;
    bf16.matmul_dtype = "";
    bf16.gradient_dtype = "";
    EXPECT_ERROR(plan_model(cfg, bf16.model_options("cuda"), "cuda"), "--fp8-weight-transposes=jit");
    TrainOptions ok = fp8("e4m3");
    ok.fp8_weight_transposes = "jit";
    EXPECT_NO_THROW(plan_model(cfg, ok.model_options("cuda"), "cuda"));
    // LoRA's FP8 base transposes just in time anyway: jit is accepted there and changes nothing
    TrainOptions lora = fp8();
    lora.lora_rank = 8;
    const MemoryPlan lora_kept = plan_model(cfg, lora.model_options("cuda"), "cuda");
    lora.fp8_weight_transposes = "jit";
    const MemoryPlan lora_jit = plan_model(cfg, lora.model_options("cuda"), "cuda");
    EXPECT_EQ(lora_jit.total_device(), lora_kept.total_device());
#endif
}

#ifdef QTRAIN_HAVE_CUDA
// The largest layer matrix (gate|up for these models): what the one transpose scratch holds.
uint64_t largest_layer_matrix(const ModelConfig& c) {
    const int64_t h = c.hidden_size, q = c.q_dim(), qkv = q + 2 * c.kv_dim(), I = c.intermediate_size;
    return static_cast<uint64_t>(std::max({qkv * h, h * q, 2 * I * h, h * I}));
}

struct Plans {
    MemoryPlan kept, jit;
};
Plans plans(const ModelConfig& cfg, TrainOptions t) {
    Plans p{plan_model(cfg, t.model_options("cuda"), "cuda"), {}};
    t.fp8_weight_transposes = "jit";
    p.jit = plan_model(cfg, t.model_options("cuda"), "cuda");
    return p;
}

// Resident: the kept layout has wq and wTq over the flat parameters (P bytes each, the second at an
// aligned offset); jit has wq only, plus the scratch in its own category. Nothing else changes.
TEST(Fp8WeightTransposes, GpuPlanDropsTheResidentTransposedCopies) {
    for (const char* model : {"Qwen2.5-0.5B", "Llama-3.2-1B"}) {
        SCOPED_TRACE(model);
        const ModelConfig cfg = preset_config(model);
        const uint64_t P = make_gpu_layout(cfg).total;
        const Plans p = plans(cfg, fp8());
        EXPECT_EQ(category(p.kept, "Quants"), aligned(P) + P);
        EXPECT_EQ(category(p.jit, "Quants"), P);
        EXPECT_FALSE(has_category(p.kept, "Transpose scratch"));
        EXPECT_EQ(category(p.jit, "Transpose scratch"), largest_layer_matrix(cfg));
        EXPECT_EQ(p.kept.total_device() - p.jit.total_device(), aligned(P) - largest_layer_matrix(cfg));
        for (const char* same : {"Weights", "Master", "Gradients", "Adam M", "Adam V", "Activations", "Workspace"})
            EXPECT_EQ(category(p.jit, same), category(p.kept, same)) << same;
    }
}

// An FP8 LM head keeps its transposed copy: in wTq at its flat offset when kept, in lm_wTq (V x h
// bytes, after wq) under jit.
TEST(Fp8WeightTransposes, TheFp8LmHeadKeepsItsTransposedCopy) {
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    const uint64_t P = make_gpu_layout(cfg).total, Vh = static_cast<uint64_t>(cfg.vocab_size) * cfg.hidden_size;
    TrainOptions t = fp8();
    t.lm_head_dtype = "e4m3";
    const Plans p = plans(cfg, t);
    EXPECT_EQ(category(p.kept, "Quants"), aligned(P) + P);
    EXPECT_EQ(category(p.jit, "Quants"), aligned(P) + Vh);
}

// Streamed (--shard-weights on one GPU, with or without --persistent-quants) and ZeRO-3: the two slots'
// transposed copies (one layer span each) are dropped; the persistent store held row-major codes only.
TEST(Fp8WeightTransposes, GpuPlanDropsTheStreamedSlotsTransposedCopies) {
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    const uint64_t span = make_gpu_layout(cfg).layer_span;
    for (int variant = 0; variant < 3; ++variant) {
        TrainOptions t = fp8();
        t.shard_weights = true;
        if (variant == 1) t.persistent_quants = true;
        if (variant == 2) t.gpus = 2, t.zero_level = 3;
        SCOPED_TRACE(variant == 0 ? "streamed" : variant == 1 ? "streamed, persistent quants" : "ZeRO-3");
        const Plans p = plans(cfg, t);
        EXPECT_EQ(category(p.kept, "Quants") - category(p.jit, "Quants"), 2 * aligned(span));
        EXPECT_EQ(category(p.jit, "Transpose scratch"), largest_layer_matrix(cfg));
        EXPECT_EQ(category(p.jit, "Persistent quants"), category(p.kept, "Persistent quants"));
        EXPECT_EQ(category(p.jit, "Weight slots"), category(p.kept, "Weight slots"));
    }
}

// The ladder of a plan over the limit tries --fp8-weight-transposes=jit first (alone, then on every rung),
// when FP8 gradients are on and it is not given; the suggestion fits when followed.
TEST(Fp8WeightTransposes, TheMemoryLadderSuggestsItFirst) {
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    TrainOptions t = fp8();
    t.lmhead_chunks = 8;  // (so the ladder's "more LM-head chunks alone" step does not apply)
    const Plans p = plans(cfg, t);
    ASSERT_LT(p.jit.total_device(), p.kept.total_device());
    EXPECT_EQ(flags_that_fit(cfg, t, "cuda", p.jit.total_device()), "--fp8-weight-transposes=jit");
    // a limit only jit with the first recompute rung meets
    TrainOptions swiglu = t;
    swiglu.fp8_weight_transposes = "jit";
    swiglu.recompute_swiglu = true;
    const uint64_t limit = plan_model(cfg, swiglu.model_options("cuda"), "cuda").total_device();
    ASSERT_LT(limit, p.jit.total_device());
    EXPECT_EQ(flags_that_fit(cfg, t, "cuda", limit), "--fp8-weight-transposes=jit --recompute-swiglu");
    // given already, or without FP8 gradients, the ladder is as before
    TrainOptions given = t;
    given.fp8_weight_transposes = "jit";
    EXPECT_EQ(flags_that_fit(cfg, given, "cuda", limit), "--recompute-swiglu");
    TrainOptions bf16_grads = fp8("bf16");
    bf16_grads.lmhead_chunks = 8;
    const uint64_t bf16_limit = plan_model(cfg, bf16_grads.model_options("cuda"), "cuda").total_device() - 1;
    EXPECT_EQ(flags_that_fit(cfg, bf16_grads, "cuda", bf16_limit).find("--fp8-weight-transposes"), std::string::npos);
}
#endif

}  // namespace
}  // namespace qtrain
