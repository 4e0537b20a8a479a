// ZeRO-3 of the frozen base under LoRA on the GPU model (issue 33; --gpus=N --zero-level=3 --lora-rank):
// the plan each rank's GPU gets, which needs no GPU. Each rank keeps 1/N of the base — the bf16 base's
// model-dtype block beside the whole non-layer weights, or the FP8 base's block of its layers' e4m3 codes
// beside its whole norms, biases, embedding and head — and two layer slots the layers are gathered into;
// the adapters' arenas are ZeRO-2's. What stays refused names its flags; `train --plan-only` says so and
// the memory ladder offers the ZeRO-3 rung to LoRA.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "backends/model_backends.h"
#include "core/error.h"
#include "model/cuda/gpu_layout.h"
#include "model/cuda/param_shard.h"
#include "model/model_config.h"
#include "test_util.h"
#include "train/train_cli_fixture.h"
#include "train/train_options.h"

namespace qtrain {
namespace {

int64_t device(const MemoryPlan& p, const std::string& category) {
    for (const auto& e : p.entries)
        if (e.category == category) return static_cast<int64_t>(e.device_bytes);
    return -1;
}

int64_t pinned(const MemoryPlan& p, const std::string& category) {
    for (const auto& e : p.entries)
        if (e.category == category) return static_cast<int64_t>(e.pinned_bytes);
    return -1;
}

ModelOptions lora_options(int gpus, int zero_level, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--seq-len=256", "--batch-size=2", "--model-dtype=bf16", "--lora-rank=16",
                               "--lora-alpha=32", "--gpus=" + std::to_string(gpus),
                               "--zero-level=" + std::to_string(zero_level)});
    return train_options_from_args(extra).model_options("cuda");
}

#ifdef QTRAIN_HAVE_CUDA
// 256-byte arena pieces: what a block of `bytes` takes at most beyond itself
constexpr int64_t kAlign = 256;

TEST(LoraZeroThreePlan, TheBf16BaseIsOneRanksBlockAndTwoSlots) {
    for (const char* preset : {"Qwen2.5-0.5B", "Llama-3.1-8B"}) {  // (tied, untied)
        for (const char* matmul : {"bf16", "e4m3"}) {  // (e4m3 with bf16 gradients keeps the bf16 base)
            for (int world : {2, 3}) {
                SCOPED_TRACE(std::string(preset) + " " + matmul + " " + std::to_string(world) + " ranks");
                const ModelConfig cfg = preset_config(preset);
                const std::vector<std::string> m = {std::string("--matmul-dtype=") + matmul};
                const ModelOptions o3 = lora_options(world, 3, m);
                ASSERT_TRUE(o3.shard_weights);
                const MemoryPlan z1 = plan_model(cfg, lora_options(world, 1, m), "cuda");
                const MemoryPlan z2 = plan_model(cfg, lora_options(world, 2, m), "cuda");
                const MemoryPlan z3 = plan_model(cfg, o3, "cuda");
                const GpuParamLayout layout = make_gpu_layout(cfg);
                const ParamShard block = param_shard(layout.total, world, 0);
                // ZeRO-1/2: the whole base (padded to the blocks); ZeRO-3: one block of it, 1/N
                EXPECT_EQ(device(z1, "Weights"), 2 * block.padded_total());
                EXPECT_EQ(device(z3, "Weights"), 2 * block.size);
                EXPECT_EQ(world * device(z3, "Weights"), device(z1, "Weights"));
                // the whole non-layer weights and two bf16 layer spans
                const int64_t non_layer = layout.total - (layout.layers_end() - layout.layer_begin(0));
                const int64_t slots = 2 * non_layer + 2 * 2 * layout.layer_span;
                EXPECT_GE(device(z3, "Weight slots"), slots);
                EXPECT_LE(device(z3, "Weight slots"), slots + 3 * kAlign);
                EXPECT_EQ(device(z1, "Weight slots"), -1);
                // e4m3 matmuls: the layers quantised as they arrive, two e4m3 spans instead of a resident copy
                if (std::string(matmul) == "e4m3") {
                    EXPECT_GE(device(z3, "Quants"), 2 * layout.layer_span);
                    EXPECT_LT(device(z3, "Quants"), device(z1, "Quants") / 4);
                }
                // nothing on the host; no gradient of the base (ZeRO-2's per-layer slots are the full model's)
                EXPECT_EQ(z3.total_pinned(), z1.total_pinned());
                EXPECT_EQ(device(z3, "Gradient slots"), -1);
                EXPECT_EQ(device(z2, "Gradient slots"), -1);
                EXPECT_EQ(device(z3, "Gradients"), 0);
                // the adapters' arenas are ZeRO-2's, and so are the activations
                for (const char* same : {"LoRA adapters", "LoRA activations", "Activations"})
                    EXPECT_EQ(device(z3, same), device(z2, same)) << same;
                EXPECT_LT(z3.total_device(), z1.total_device());
            }
        }
    }
}

TEST(LoraZeroThreePlan, TheFp8BaseKeepsOneRanksBlockOfItsCodes) {
    for (const char* preset : {"Qwen2.5-0.5B", "Llama-3.1-8B"}) {
        for (const char* grad : {"e4m3", "e5m2"}) {
            for (int world : {2, 3}) {
                SCOPED_TRACE(std::string(preset) + " " + grad + " " + std::to_string(world) + " ranks");
                const ModelConfig cfg = preset_config(preset);
                const std::vector<std::string> fp8 = {"--matmul-dtype=e4m3", std::string("--gradient-dtype=") + grad};
                const MemoryPlan z1 = plan_model(cfg, lora_options(world, 1, fp8), "cuda");
                const MemoryPlan z3 = plan_model(cfg, lora_options(world, 3, fp8), "cuda");
                const GpuParamLayout layout = make_gpu_layout(cfg);
                const int64_t codes = layout.layers_end() - layout.layer_begin(0);
                const ParamShard block = param_shard(codes, world, 0);
                // ZeRO-1: every layer's code (one byte each); ZeRO-3: one rank's block of them
                EXPECT_GE(device(z1, "Quants"), codes);
                EXPECT_LT(device(z1, "Quants"), codes + kAlign);
                EXPECT_GE(device(z3, "Quants"), block.size);
                EXPECT_LT(device(z3, "Quants"), block.size + kAlign);
                EXPECT_LE(world * device(z3, "Quants"), device(z1, "Quants") + world * 64 + kAlign);
                // the codes stay on the device (one GPU's --shard-weights pins them: "Streamed base")
                EXPECT_EQ(device(z3, "Streamed base"), -1);
                EXPECT_EQ(z3.total_pinned(), z1.total_pinned());
                // two layer spans of codes; the norms, biases, embedding and head whole as at ZeRO-1
                EXPECT_GE(device(z3, "Weight slots"), 2 * layout.layer_span);
                EXPECT_LE(device(z3, "Weight slots"), 2 * layout.layer_span + 2 * kAlign);
                for (const char* same : {"Weights", "Transpose scratch", "Activations", "LoRA activations"})
                    EXPECT_EQ(device(z3, same), device(z1, same)) << same;
                EXPECT_EQ(device(z3, "Gradient slots"), -1);
                EXPECT_LT(z3.total_device(), z1.total_device());
            }
        }
    }
}

TEST(LoraZeroThreePlan, WhatStaysRefusedNamesItsFlags) {
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    // ZeRO-3's gathers are collectives on the weights' copy stream, which a CUDA graph does not capture
    EXPECT_ERROR(plan_model(cfg, lora_options(2, 3, {"--use-cuda-graphs"}), "cuda"), "--use-cuda-graphs",
                 "--shard-weights", "--gpus=1");
    // --train-also writes into the base: on the bf16 base each rank writes its block's part (session 25;
    // CudaLoraZeroThree runs it on the GPU); the FP8 base keeps those tensors whole on every rank
    EXPECT_NO_THROW(plan_model(cfg, lora_options(2, 3, {"--train-also=norms,embeddings"}), "cuda"));
    EXPECT_NO_THROW(plan_model(
        cfg, lora_options(2, 3, {"--train-also=norms,embeddings", "--matmul-dtype=e4m3", "--gradient-dtype=e5m2"}),
        "cuda"));
    // the FP8 base's codes are already quantised once: nothing to keep per step
    EXPECT_ERROR(plan_model(cfg,
                            lora_options(2, 3, {"--matmul-dtype=e4m3", "--gradient-dtype=e5m2", "--persistent-quants"}),
                            "cuda"),
                 "--lora-rank=16", "--persistent-quants");
    EXPECT_ERROR(plan_model(cfg, lora_options(2, 3, {"--offload-master"}), "cuda"), "--lora-rank=16",
                 "--offload-master", "not yet supported");
}
#endif

// `train --plan-only`: the base at 1/2 and the note that says what each rank keeps; the memory ladder's
// ZeRO-3 rung is taken for LoRA when only it fits.
TEST(LoraZeroThreePlan, PlanOnlyShowsTheBaseAtHalfAndTheLadderOffersZeroThree) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "this build has no CUDA backend";
#else
    using namespace qtrain::test;
    using namespace qtrain::test::train_cli;
    const std::string base = train_exe() +
                             " --device=cuda --model=Qwen2.5-7B --from-scratch --plan-only --seq-len=1024"
                             " --batch-size=1 --model-dtype=bf16 --lora-rank=16 --gpus=2";
    auto weights_mib = [](const std::string& out) {  // the device MiB of the plan's "Weights" row
        std::istringstream lines(out);
        for (std::string line; std::getline(lines, line);) {
            std::istringstream words(line);
            std::string name;
            long mib = -1;
            if (words >> name >> mib && name == "Weights") return mib;
        }
        return -1L;
    };
    auto z1 = run_command(base + " --zero-level=1");
    auto z3 = run_command(base + " --zero-level=3");
    ASSERT_EQ(z1.exit_code, 0) << z1.output;
    ASSERT_EQ(z3.exit_code, 0) << z3.output;
    EXPECT_TRUE(Contains(z3.output, "LoRA at ZeRO-3: the frozen base is one rank's block, 1/2 of it")) << z3.output;
    EXPECT_TRUE(Contains(z3.output, "Weight slots")) << z3.output;
    const long w1 = weights_mib(z1.output), w3 = weights_mib(z3.output);
    ASSERT_GT(w3, 0) << z3.output;
    EXPECT_NEAR(2.0 * w3, static_cast<double>(w1), 2.0) << z1.output << z3.output;
    auto fp8 = run_command(base + " --zero-level=3 --matmul-dtype=e4m3 --gradient-dtype=e5m2");
    ASSERT_EQ(fp8.exit_code, 0) << fp8.output;
    EXPECT_TRUE(Contains(fp8.output, "the FP8 base's e4m3 codes of the layers")) << fp8.output;
    // 7B's bf16 base does not fit 13 GiB whole on each of 2 GPUs even with --recompute-block; 1/2 of it does
    auto ladder = run_command(base + " --memory-limit=13GiB");
    EXPECT_EQ(ladder.exit_code, 1) << ladder.output;
    EXPECT_TRUE(Contains(ladder.output, "it fits with --recompute-block --zero-level=3")) << ladder.output;
    EXPECT_EQ(run_command(base + " --memory-limit=13GiB --recompute-block --zero-level=3").exit_code, 0);
#endif
}

}  // namespace
}  // namespace qtrain
