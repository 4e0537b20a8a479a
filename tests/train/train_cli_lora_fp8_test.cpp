// LoRA on an FP8 base through the `train` program (issue 33): --matmul-dtype=e4m3 under --lora-rank
// is the FP8 base (no separate flag). On the CPU model (which emulates it) the run trains, its losses
// are not the exact base's, and --continue reproduces the uninterrupted run bit for bit; the GPU
// plan (--plan-only) shows the base's e4m3 copies next to its bf16 weights.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;

TEST(TrainCliLoraFp8, CpuRunTrainsAndContinuesBitExact) {
    Fixture f;
    const std::string lora = " --steps=3 --eval-every-n-steps=0 --lora-rank=4 --lora-dropout=0.1";
    auto exact = run_command(f.base_cmd("exact") + lora);
    ASSERT_EQ(exact.exit_code, 0) << exact.output;
    auto fp8 = run_command(f.base_cmd("fp8") + lora + " --matmul-dtype=e4m3 --gradient-dtype=e5m2");
    ASSERT_EQ(fp8.exit_code, 0) << fp8.output;
    const std::vector<double> le = step_losses(f.dir / "exact/log.jsonl"), l8 = step_losses(f.dir / "fp8/log.jsonl");
    ASSERT_EQ(l8.size(), 3u);
    EXPECT_NE(l8, le) << "the FP8 base changed no loss";
    for (std::size_t i = 0; i < l8.size(); ++i) EXPECT_NEAR(l8[i], le[i], 0.05 * le[i]) << "step " << i + 1;
    expect_continue_reproduces_full_run(f, "cpu",
                                        " --lora-rank=4 --lora-dropout=0.1 --matmul-dtype=e4m3 --gradient-dtype=e5m2 "
                                        "--merge-lora");
}

TEST(TrainCliLoraFp8, CudaPlanShowsTheE4m3Copies) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "this build has no CUDA backend";
#else
    Fixture f(kGpuShape);  // (the GPU attention's head dim, FP8's multiples of 16)
    auto plan = run_command(f.base_cmd("plan", "cuda") +
                            " --plan-only --model-dtype=bf16 --lora-rank=4 --matmul-dtype=e4m3 --gradient-dtype=e5m2");
    EXPECT_EQ(plan.exit_code, 0) << plan.output;
    EXPECT_TRUE(Contains(plan.output, "Quants")) << plan.output;
    EXPECT_TRUE(Contains(plan.output, "Transpose scratch")) << plan.output;  // (W^T one matrix at a time)
    EXPECT_TRUE(Contains(plan.output, "LoRA adapters")) << plan.output;
#endif
}

// The FP8 base streamed from host memory (--shard-weights under LoRA, one GPU): --plan-only shows the
// e4m3 codes pinned ("Streamed base") and two layer slots on the device, no resident "Quants"; 32B LoRA
// on a 24 GiB card, refused without it, is told that --shard-weights makes it fit (the memory ladder's
// LoRA rung), and fits with it at the batch the plan names.
TEST(TrainCliLoraFp8, CudaPlanStreamsTheBaseFromHost) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "this build has no CUDA backend";
#else
    const std::string base = train_exe() +
                             " --device=cuda --model=Qwen2.5-32B --from-scratch --plan-only --seq-len=2048"
                             " --model-dtype=bf16 --lora-rank=16 --matmul-dtype=e4m3 --gradient-dtype=e5m2"
                             " --recompute-block --memory-limit=24GiB";
    auto resident = run_command(base + " --batch-size=1");
    EXPECT_EQ(resident.exit_code, 1) << resident.output;
    EXPECT_TRUE(Contains(resident.output, "it fits with --recompute-block --shard-weights")) << resident.output;
    auto streamed = run_command(base + " --batch-size=1 --shard-weights");
    EXPECT_EQ(streamed.exit_code, 0) << streamed.output;
    for (const char* category : {"Streamed base", "Weight slots", "Transpose scratch", "LoRA adapters"})
        EXPECT_TRUE(Contains(streamed.output, category)) << category << "\n" << streamed.output;
    EXPECT_FALSE(Contains(streamed.output, "Quants")) << streamed.output;
    const std::string key = "with these flags --batch-size up to ";
    const auto at = streamed.output.find(key);
    ASSERT_NE(at, std::string::npos) << streamed.output;
    const int largest = std::atoi(streamed.output.c_str() + at + key.size());
    EXPECT_GE(largest, 2);
    EXPECT_EQ(run_command(base + " --shard-weights --batch-size=" + std::to_string(largest)).exit_code, 0);
    EXPECT_EQ(run_command(base + " --shard-weights --batch-size=" + std::to_string(largest + 1)).exit_code, 1);
#endif
}
