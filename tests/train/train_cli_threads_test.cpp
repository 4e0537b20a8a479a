// Threads mode through `train` (issue 18): --gpus=N on the CPU model runs N data-parallel ranks as
// threads, every rank in the same loop (src/train/rank_session.h). N ranks with accumulation A equal one
// rank with N x A (the same chunks in the same global order; only the order of the micro-batch
// additions differs), ZeRO-1 and ZeRO-2 are bit-identical, evaluation split over the ranks equals one
// rank's, checkpoints written by every rank resume bit for bit at the same N and are refused at
// another, and a rank that fails stops every rank. Every run is under `timeout`, so a hang fails the
// test instead of hanging CI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/train_cli_fixture.h"
#include "train/train_cli_ranks.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;

namespace {

const std::string kLimit = "timeout 120 ";

// One float ulp at x: the most two ways of rounding the same double sum to fp32 can differ by.
double ulp(double x) {
    const float f = static_cast<float>(x);
    return std::nextafter(std::abs(f), INFINITY) - std::abs(f);
}

}  // namespace

TEST(TrainCliThreads, RanksEqualOneRankWithTheirAccumulation) {
    Fixture f;
    const std::string common = " --steps=8 --eval-every-n-steps=0 --grad-clip=0.3";
    for (int world : {2, 3}) {
        SCOPED_TRACE("--gpus=" + std::to_string(world));
        ASSERT_NO_FATAL_FAILURE(expect_ranks_equal_one_rank(f, kLimit, common, world, 8,
                                                            "threads mode: " + std::to_string(world) + " CPU ranks"));
        const std::string one = "one" + std::to_string(world), many = "many" + std::to_string(world);
        EXPECT_LE(relative_weight_difference(read_all_weights(f.dir / (one + "/model.safetensors")),
                                             read_all_weights(f.dir / (many + "/model.safetensors"))),
                  1e-5);
    }
}

TEST(TrainCliThreads, ZeroLevelsOneAndTwoAreBitIdentical) {
    Fixture f;
    const std::string common = " --steps=6 --eval-every-n-steps=0 --grad-accumulation=2 --gpus=2";
    auto z1 = run_command(kLimit + f.base_cmd("z1") + common + " --zero-level=1");
    auto z2 = run_command(kLimit + f.base_cmd("z2") + common + " --zero-level=2");
    ASSERT_EQ(z1.exit_code, 0) << z1.output;
    ASSERT_EQ(z2.exit_code, 0) << z2.output;
    EXPECT_EQ(step_losses(f.dir / "z1/log.jsonl"), step_losses(f.dir / "z2/log.jsonl"));
    EXPECT_EQ(read_file(f.dir / "z1/model.safetensors"), read_file(f.dir / "z2/model.safetensors"));
}

// The checkpoints are written collectively (every rank into one directory, rank 0 records them).
TEST(TrainCliThreads, ContinueReproducesTheUninterruptedRunExactly) {
    Fixture f;
    expect_continue_reproduces_full_run(f, "cpu", " --gpus=2 --grad-accumulation=1", kLimit);
}

// --steps=0: every run evaluates the same initial weights, so only the split of the eval batches over
// the ranks differs. 15 eval batches (the set) and 5 (--eval-num-steps): neither divides by 2 and 3.
TEST(TrainCliThreads, EvaluationSplitOverRanksEqualsOneRank) {
    Fixture f;
    for (int batches : {0, 5}) {
        const std::string common = " --steps=0 --eval-num-steps=" + std::to_string(batches);
        const std::string one = "eval1-" + std::to_string(batches);
        auto a = run_command(kLimit + f.base_cmd(one) + common);
        ASSERT_EQ(a.exit_code, 0) << a.output;
        const auto loss_a = event_values(f.dir / (one + "/log.jsonl"), "eval", "loss");
        const auto tokens_a = event_values(f.dir / (one + "/log.jsonl"), "eval", "eval_tokens");
        ASSERT_EQ(loss_a.size(), 1u);
        ASSERT_TRUE(std::isfinite(loss_a[0]));
        for (int world : {2, 3}) {
            SCOPED_TRACE("--eval-num-steps=" + std::to_string(batches) + " --gpus=" + std::to_string(world));
            const std::string many = "eval" + std::to_string(world) + "-" + std::to_string(batches);
            auto b = run_command(kLimit + f.base_cmd(many) + common + " --gpus=" + std::to_string(world));
            ASSERT_EQ(b.exit_code, 0) << b.output;
            const auto loss_b = event_values(f.dir / (many + "/log.jsonl"), "eval", "loss");
            ASSERT_EQ(loss_b.size(), 1u);
            EXPECT_LE(std::abs(loss_b[0] - loss_a[0]), ulp(loss_a[0])) << loss_b[0] << " vs " << loss_a[0];
            EXPECT_EQ(event_values(f.dir / (many + "/log.jsonl"), "eval", "eval_tokens"), tokens_a);
        }
    }
}

// The CPU model's checkpoint is its whole state, so it resumes at another number of ranks when the
// step keeps its micro-batches (accumulation x ranks): 2 ranks x 3 continue as 3 x 2 and 1 x 6 with the
// losses of the uninterrupted 2-rank run (the same sequences per step, summed in another order); another
// global batch is refused, naming the accumulation that keeps it.
TEST(TrainCliThreads, CheckpointResumesAtAnotherNumberOfRanksWithTheSameMicroBatchesPerStep) {
    namespace fs = std::filesystem;
    Fixture f;
    const std::string common = " --eval-every-n-steps=0 --ckpt-interval=4 --steps=8";
    auto whole = run_command(kLimit + f.base_cmd("ws") + common + " --gpus=2 --grad-accumulation=3");
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    const auto state = nlohmann::json::parse(read_file(f.dir / "ws-ckpt/step_00000004/state.json"));
    EXPECT_EQ(state["world_size"], 2);
    EXPECT_TRUE(state["files"].contains("optimizer.safetensors")) << state.dump(2);
    const auto reference = step_losses(f.dir / "ws/log.jsonl");
    ASSERT_EQ(reference.size(), 8u);
    for (auto [ranks, accum] : {std::pair{3, 2}, std::pair{1, 6}}) {
        const std::string name = "r" + std::to_string(ranks);
        SCOPED_TRACE(name);
        std::string output;
        ASSERT_NO_FATAL_FAILURE(expect_resume_at_ranks(f, kLimit, common, name, ranks, accum, 4, 8, reference, &output));
        EXPECT_TRUE(Contains(output, "the same 6 micro-batches per step")) << output;
    }
    fs::copy(f.dir / "ws-ckpt", f.dir / "bad-ckpt", fs::copy_options::recursive);
    expect_refused(run_command(kLimit + f.base_cmd("bad") + common + " --continue --gpus=3 --grad-accumulation=3"),
                   "a step would take 9 micro-batches (accumulation x ranks) instead of 6");
    EXPECT_TRUE(Contains(run_command(kLimit + f.base_cmd("bad") + common + " --continue --gpus=4 --grad-accumulation=3")
                             .output,
                         "keep --grad-accumulation x ranks at 6"));
}

// QTRAIN_TEST_FAIL_RANK=r:s makes rank r throw at step s: every rank stops, with r's error.
TEST(TrainCliThreads, AFailingRankStopsEveryRankWithItsError) {
    Fixture f;
    for (auto [rank, world] : {std::pair{1, 3}, std::pair{0, 2}}) {
        const std::string name = "fail" + std::to_string(rank);
        SCOPED_TRACE(name);
        const std::string fault = std::to_string(rank) + ":2";
        auto r = run_command("QTRAIN_TEST_FAIL_RANK=" + fault + " " + kLimit + f.base_cmd(name) +
                             " --steps=6 --eval-every-n-steps=0 --gpus=" + std::to_string(world));
        EXPECT_NE(r.exit_code, 0) << r.output;
        EXPECT_NE(r.exit_code, 124) << "the ranks hung:\n" << r.output;
        EXPECT_TRUE(Contains(r.output, "rank " + std::to_string(rank) + " of " + std::to_string(world) +
                                           " failed: deliberate failure at step 2 (QTRAIN_TEST_FAIL_RANK=" + fault))
            << r.output;
        EXPECT_EQ(step_losses(f.dir / (name + "/log.jsonl")).size(), 2u) << "steps 0 and 1 ran, not step 2";
        EXPECT_FALSE(std::filesystem::exists(f.dir / (name + "/model.safetensors")));
    }
    auto bad = run_command("QTRAIN_TEST_FAIL_RANK=one " + kLimit + f.base_cmd("bad") + " --steps=1");
    EXPECT_EQ(bad.exit_code, 1) << bad.output;
    EXPECT_TRUE(Contains(bad.output, "QTRAIN_TEST_FAIL_RANK='one': expected <rank>:<step>")) << bad.output;
}

TEST(TrainCliThreads, GpuIdsAreCheckedNamingTheFlag) {
    Fixture f;
    const std::string run = kLimit + f.base_cmd("ids") + " --steps=1";
    expect_refused(run_command(run + " --gpus=2 --gpu-ids=0,x"), "--gpu-ids=0,x: 'x' is not a device index");
    expect_refused(run_command(run + " --gpus=2 --gpu-ids=0,,1"), "--gpu-ids=0,,1: '' is not a device index");
    expect_refused(run_command(run + " --gpus=2 --gpu-ids=-1,0"), "'-1' is not a device index");
    expect_refused(run_command(run + " --gpus=2 --gpu-ids=0,1,2"),
                   "--gpu-ids lists 3 devices but the run has 2 ranks (--gpus=2)");
    // the CPU ranks have no device to place
    expect_refused(run_command(run + " --gpus=2 --gpu-ids=0,0"), "--gpu-ids is not supported on --device=cpu");
}
