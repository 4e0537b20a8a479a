// Data parallel on the GPU through `train` (issue 18), on one GPU: --gpus=2 --gpu-ids=0,0
// --memcpy-all-gather puts two ranks (threads) on device 0 with the copy-engine communicator. Two ranks
// with accumulation A equal one rank with 2A to bf16 rounding, ZeRO-1 and ZeRO-2 give the same bits,
// --continue at the same world size reproduces the uninterrupted run bit for bit (every rank writes
// its block of the optimizer state), NCCL refuses two ranks on one GPU naming the way out, and a rank
// that fails stops both. ZeRO-3 gives ZeRO-2's bits through the whole run (losses, an eval split
// unevenly over the ranks, the exported model) and resumes from its block checkpoint exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "gpu_test_util.h"
#include "io/safetensors.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;

namespace {

const std::string kLimit = "timeout 300 ";
const std::string kTwoOnOne = " --gpus=2 --gpu-ids=0,0 --memcpy-all-gather";

bool same_files(const std::string& a, const std::string& b) { return read_file(a) == read_file(b); }

}  // namespace

TEST(TrainCliGpuDataParallel, TwoRanksOnOneGpuEqualOneRankAndZeroLevelsAgree) {
    QTRAIN_REQUIRE_GPU();
    Fixture f(kGpuShape);
    const std::string common = " --steps=10 --eval-every-n-steps=5 --eval-num-steps=4";
    // one micro-batch per rank, so ZeRO-2's per-layer reductions add the same sums as ZeRO-1's all-reduce
    auto one = run_command(kLimit + f.base_cmd("one", "cuda") + common + " --grad-accumulation=2");
    auto z1 = run_command(kLimit + f.base_cmd("z1", "cuda") + common + kTwoOnOne + " --grad-accumulation=1");
    auto z2 = run_command(kLimit + f.base_cmd("z2", "cuda") + common + kTwoOnOne + " --grad-accumulation=1 --zero-level=2");
    ASSERT_EQ(one.exit_code, 0) << one.output;
    ASSERT_EQ(z1.exit_code, 0) << z1.output;
    ASSERT_EQ(z2.exit_code, 0) << z2.output;
    EXPECT_TRUE(Contains(z1.output, "2 GPU ranks, ZeRO-1")) << z1.output;
    EXPECT_TRUE(Contains(z2.output, "2 GPU ranks, ZeRO-2")) << z2.output;
    const auto l1 = step_losses(f.dir / "one/log.jsonl"), lz1 = step_losses(f.dir / "z1/log.jsonl"),
               lz2 = step_losses(f.dir / "z2/log.jsonl");
    ASSERT_EQ(l1.size(), 10u);
    ASSERT_EQ(lz1.size(), 10u);
    EXPECT_EQ(lz1, lz2);  // equal as logged (and the exported weights byte for byte, below)
    for (int s = 0; s < 10; ++s) EXPECT_NEAR(lz1[s], l1[s], 2e-3 * l1[s]) << "step " << s;
    const auto e1 = event_values(f.dir / "one/log.jsonl", "eval", "loss"),
               ez1 = event_values(f.dir / "z1/log.jsonl", "eval", "loss");
    ASSERT_EQ(e1.size(), ez1.size());
    for (std::size_t i = 0; i < e1.size(); ++i) EXPECT_NEAR(ez1[i], e1[i], 2e-3 * e1[i]) << "eval " << i;
    EXPECT_TRUE(same_files(f.dir / "z1/model.safetensors", f.dir / "z2/model.safetensors"));
    const double d = relative_weight_difference(read_all_weights(f.dir / "one/model.safetensors"),
                                                read_all_weights(f.dir / "z1/model.safetensors"));
    std::printf("[train dp] 2 ranks on one GPU vs 1 rank with 2x accumulation: loss %.5f vs %.5f at step 9, "
                "weights max rel diff %.2e\n", lz1.back(), l1.back(), d);
    EXPECT_LT(d, 2e-2);  // bf16 weights: a few ulps of the largest
    EXPECT_LT(l1.back(), l1.front());
}

TEST(TrainCliGpuDataParallel, ContinueReproducesTheUninterruptedRunExactly) {
    QTRAIN_REQUIRE_GPU();
    for (const char* extra : {"", " --zero-level=2 --matmul-dtype=e4m3 --opt-m-dtype=bf16",
                              " --zero-level=2 --matmul-dtype=e4m3 --use-cuda-graphs"}) {
        SCOPED_TRACE(extra);
        Fixture f(kGpuShape);
        expect_continue_reproduces_full_run(f, "cuda", kTwoOnOne + std::string(extra), kLimit);
        EXPECT_TRUE(std::filesystem::exists(f.dir / "part-ckpt/step_00000005/block-00001-of-00002.safetensors"));
    }
}

TEST(TrainCliGpuDataParallel, NcclRefusesTwoRanksOnOneGpuAndAFailingRankStopsBoth) {
    QTRAIN_REQUIRE_GPU();
    Fixture f(kGpuShape);
    auto nccl = run_command(kLimit + f.base_cmd("nccl", "cuda") + " --steps=2 --gpus=2 --gpu-ids=0,0");
    EXPECT_NE(nccl.exit_code, 0);
    EXPECT_TRUE(Contains(nccl.output, "--memcpy-all-gather")) << nccl.output;
    auto fail = run_command("QTRAIN_TEST_FAIL_RANK=1:2 " + kLimit + f.base_cmd("fail", "cuda") + " --steps=6" + kTwoOnOne);
    EXPECT_EQ(fail.exit_code, 1) << fail.output;
    EXPECT_TRUE(Contains(fail.output, "rank 1")) << fail.output;
}

TEST(TrainCliGpuDataParallel, ZeroThreeGivesZeroTwosRunAndResumesExactly) {
    QTRAIN_REQUIRE_GPU();
    Fixture f(kGpuShape);
    // 3 eval batches over 2 ranks: under ZeRO-3 the rank without a third batch still joins the gathers
    const std::string common = " --steps=8 --eval-every-n-steps=4 --eval-num-steps=3 --grad-accumulation=2";
    auto z2 = run_command(kLimit + f.base_cmd("z2", "cuda") + common + kTwoOnOne + " --zero-level=2");
    auto z3 = run_command(kLimit + f.base_cmd("z3", "cuda") + common + kTwoOnOne + " --zero-level=3");
    ASSERT_EQ(z2.exit_code, 0) << z2.output;
    ASSERT_EQ(z3.exit_code, 0) << z3.output;
    EXPECT_TRUE(Contains(z3.output, "2 GPU ranks, ZeRO-3")) << z3.output;
    const auto l2 = step_losses(f.dir / "z2/log.jsonl"), l3 = step_losses(f.dir / "z3/log.jsonl");
    ASSERT_EQ(l3.size(), 8u);
    EXPECT_EQ(l2, l3);
    const auto e2 = event_values(f.dir / "z2/log.jsonl", "eval", "loss"),
               e3 = event_values(f.dir / "z3/log.jsonl", "eval", "loss");
    ASSERT_EQ(e3.size(), 2u);
    EXPECT_EQ(e2, e3);
    EXPECT_TRUE(same_files(f.dir / "z2/model.safetensors", f.dir / "z3/model.safetensors"));
    EXPECT_LT(l3.back(), l3.front());
    for (const char* extra : {" --zero-level=3", " --zero-level=3 --matmul-dtype=e4m3 --gradient-dtype=e4m3 "
                                                 "--persistent-quants --recompute-block"}) {
        SCOPED_TRACE(extra);
        Fixture g(kGpuShape);
        expect_continue_reproduces_full_run(g, "cuda", kTwoOnOne + std::string(extra), kLimit);
    }
}

// The other families through the same data-parallel paths on the GPU: a Qwen3 model (q/k norms,
// head_dim 128 where hidden / heads is 64) and a Llama 3 model (no biases, llama3 RoPE): 2 ranks on
// one GPU at ZeRO-1 track 1 rank with twice the accumulation, ZeRO-3 gives ZeRO-2's bits, and a ZeRO-3
// FP8 run with recompute resumes bit for bit; the exported config.json names the family.
TEST(TrainCliGpuDataParallel, QwenThreeAndLlamaShardAndResume) {
    QTRAIN_REQUIRE_GPU();
    for (const auto& [hf_class, fields] : kOtherGpuFamilies) {
        SCOPED_TRACE(hf_class);
        Fixture f(kGpuShape, fields);
        const std::string common = " --steps=8 --eval-every-n-steps=4 --eval-num-steps=3";
        auto one = run_command(kLimit + f.base_cmd("one", "cuda") + common + " --grad-accumulation=4");
        auto z1 = run_command(kLimit + f.base_cmd("z1", "cuda") + common + kTwoOnOne + " --grad-accumulation=2");
        auto z2 = run_command(kLimit + f.base_cmd("z2", "cuda") + common + kTwoOnOne +
                              " --grad-accumulation=2 --zero-level=2");
        auto z3 = run_command(kLimit + f.base_cmd("z3", "cuda") + common + kTwoOnOne +
                              " --grad-accumulation=2 --zero-level=3");
        for (const auto* r : {&one, &z1, &z2, &z3}) ASSERT_EQ(r->exit_code, 0) << r->output;
        const auto l1 = step_losses(f.dir / "one/log.jsonl"), lz1 = step_losses(f.dir / "z1/log.jsonl");
        ASSERT_EQ(lz1.size(), 8u);
        for (int s = 0; s < 8; ++s) EXPECT_NEAR(lz1[s], l1[s], 2e-3 * l1[s]) << "step " << s;
        EXPECT_EQ(step_losses(f.dir / "z3/log.jsonl"), step_losses(f.dir / "z2/log.jsonl"));
        EXPECT_TRUE(same_files(f.dir / "z2/model.safetensors", f.dir / "z3/model.safetensors"));
        EXPECT_LT(l1.back(), l1.front());
        const auto cfg = nlohmann::json::parse(read_file(f.dir / "z3/config.json"));
        EXPECT_EQ(cfg["architectures"][0], hf_class);
        Fixture g(kGpuShape, fields);
        expect_continue_reproduces_full_run(
            g, "cuda", kTwoOnOne + std::string(" --zero-level=3 --matmul-dtype=e4m3 --gradient-dtype=e5m2 --recompute-block"),
            kLimit);
    }
}
