// ZeRO-3 through `train` on the CPU model in threads mode (issue 19): --zero-level=3 (or
// --shard-weights) with several ranks keeps each rank's block of the weights and gathers every layer
// when it is used, which changes where the weights live and nothing else, so the runs have ZeRO-1's
// bits: losses, norms, evaluations (split into rounds in which every rank evaluates) and the export.
// Its checkpoint has the one CPU format, so it resumes at ZeRO-1 and at another number of ranks.
// Every run is under `timeout`, so a hang (a rank missing from a collective) fails the test.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;
namespace fs = std::filesystem;

namespace {

const std::string kLimit = "timeout 120 ";

}  // namespace

// 5 eval batches (--eval-num-steps) at 2 and 3 ranks: the last round leaves a rank without a batch of
// its own, which then evaluates one without targets; the eval losses are still ZeRO-1's.
TEST(TrainCliZero3, ThreadsEqualZeroOneBitForBitWithEvaluationAndExport) {
    Fixture f;
    const std::string common =
        " --steps=6 --eval-every-n-steps=3 --eval-num-steps=5 --grad-accumulation=2 --grad-clip=0.3";
    for (int world : {2, 3}) {
        SCOPED_TRACE("--gpus=" + std::to_string(world));
        const std::string w = std::to_string(world), z1 = "z1-" + w, z3 = "z3-" + w;
        auto a = run_command(kLimit + f.base_cmd(z1) + common + " --gpus=" + w + " --zero-level=1");
        auto b = run_command(kLimit + f.base_cmd(z3) + common + " --gpus=" + w + " --zero-level=3");
        ASSERT_EQ(a.exit_code, 0) << a.output;
        ASSERT_EQ(b.exit_code, 0) << b.output;
        EXPECT_TRUE(Contains(b.output, w + " CPU ranks, ZeRO-3")) << b.output;
        const std::string la = f.dir / (z1 + "/log.jsonl"), lb = f.dir / (z3 + "/log.jsonl");
        ASSERT_EQ(step_losses(la).size(), 6u);
        EXPECT_EQ(step_losses(lb), step_losses(la));
        EXPECT_EQ(event_values(lb, "step", "norm"), event_values(la, "step", "norm"));
        ASSERT_EQ(event_values(la, "eval", "loss").size(), 2u);
        EXPECT_EQ(event_values(lb, "eval", "loss"), event_values(la, "eval", "loss"));
        EXPECT_EQ(event_values(lb, "eval", "eval_tokens"), event_values(la, "eval", "eval_tokens"));
        EXPECT_EQ(read_file(f.dir / (z3 + "/model.safetensors")), read_file(f.dir / (z1 + "/model.safetensors")));
        EXPECT_EQ(read_file(f.dir / (z3 + "/config.json")), read_file(f.dir / (z1 + "/config.json")));
    }
    // --shard-weights with several ranks is the same ZeRO-3
    auto s = run_command(kLimit + f.base_cmd("sw") + common + " --gpus=2 --shard-weights");
    ASSERT_EQ(s.exit_code, 0) << s.output;
    EXPECT_TRUE(Contains(s.output, "2 CPU ranks, ZeRO-3")) << s.output;
    EXPECT_EQ(step_losses(f.dir / "sw/log.jsonl"), step_losses(f.dir / "z1-2/log.jsonl"));
}

// A ZeRO-3 checkpoint of 2 ranks x 3 micro-batches is the whole state in the one CPU format: it
// resumes at ZeRO-1 on 2 ranks with the uninterrupted run's bits (the same arithmetic), and on 1 rank
// x 6 and at ZeRO-3 on 3 ranks x 2 with its losses to rounding (the standard of
// TrainCliThreads.CheckpointResumesAtAnotherNumberOfRanksWithTheSameMicroBatchesPerStep). A ZeRO-1
// checkpoint resumes at ZeRO-3 with the same bits.
TEST(TrainCliZero3, CheckpointResumesAtZeroOneAndAtAnotherNumberOfRanks) {
    Fixture f;
    const std::string common = " --eval-every-n-steps=0 --ckpt-interval=4 --steps=8";
    auto whole = run_command(kLimit + f.base_cmd("z3") + common + " --gpus=2 --grad-accumulation=3 --zero-level=3");
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    const auto state = nlohmann::json::parse(read_file(f.dir / "z3-ckpt/step_00000004/state.json"));
    EXPECT_EQ(state["world_size"], 2);
    EXPECT_TRUE(state["files"].contains("optimizer.safetensors")) << state.dump(2);
    const auto reference = step_losses(f.dir / "z3/log.jsonl");
    ASSERT_EQ(reference.size(), 8u);

    struct Resume {
        const char* name;
        const char* from;  // the run whose checkpoints it copies
        int ranks, accum, zero_level;
        bool exact;
    };
    auto z1 = run_command(kLimit + f.base_cmd("z1") + common + " --gpus=2 --grad-accumulation=3 --zero-level=1");
    ASSERT_EQ(z1.exit_code, 0) << z1.output;
    ASSERT_EQ(step_losses(f.dir / "z1/log.jsonl"), reference);
    for (const Resume& r : {Resume{"as-z1", "z3", 2, 3, 1, true}, Resume{"as-one", "z3", 1, 6, 1, false},
                            Resume{"as-three", "z3", 3, 2, 3, false}, Resume{"z1-as-z3", "z1", 2, 3, 3, true}}) {
        SCOPED_TRACE(r.name);
        const std::string ckpt = f.dir / (std::string(r.name) + "-ckpt");
        fs::copy(f.dir / (std::string(r.from) + "-ckpt"), ckpt, fs::copy_options::recursive);
        fs::remove_all(ckpt + "/step_00000008");
        auto resumed = run_command(kLimit + f.base_cmd(r.name) + common + " --continue --gpus=" +
                                   std::to_string(r.ranks) + " --grad-accumulation=" + std::to_string(r.accum) +
                                   " --zero-level=" + std::to_string(r.zero_level));
        ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
        EXPECT_TRUE(Contains(resumed.output, "step_00000004")) << resumed.output;
        int first = -1;
        const auto losses = step_losses(f.dir / (std::string(r.name) + "/log.jsonl"), &first);
        EXPECT_EQ(first, 4);
        ASSERT_EQ(losses.size(), 4u);
        for (int i = 0; i < 4; ++i) {
            if (r.exact) EXPECT_EQ(losses[i], reference[4 + i]) << "step " << 4 + i;
            else EXPECT_NEAR(losses[i], reference[4 + i], 1e-6 * reference[4 + i]) << "step " << 4 + i;
        }
        if (r.exact)
            EXPECT_EQ(read_file(f.dir / (std::string(r.name) + "/model.safetensors")),
                      read_file(f.dir / (std::string(r.from) + "/model.safetensors")));
    }
}

// An export that fails after training (here model.safetensors in --out-dir is a non-empty directory,
// which the writer cannot replace) is agreed by every rank — save_hf is collective under ZeRO-3 — and
// the state is kept in a checkpoint, as with ZeRO-1; the run ends with the error, without a hang.
TEST(TrainCliZero3, AFailedExportKeepsTheStateInACheckpoint) {
    Fixture f;
    fs::create_directories(f.dir / "x/model.safetensors/blocker");
    auto r = run_command(kLimit + f.base_cmd("x") + " --steps=2 --eval-every-n-steps=0 --gpus=2 --zero-level=3");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Contains(r.output, "exporting the model to --out-dir")) << r.output;
    EXPECT_TRUE(Contains(r.output, "the trained state is in")) << r.output;
    EXPECT_TRUE(fs::exists(f.dir / "x-ckpt/step_00000002/optimizer.safetensors")) << r.output;
    // and the kept state exports: --continue at ZeRO-1 once the cause is gone
    fs::remove_all(f.dir / "x/model.safetensors");
    auto again = run_command(kLimit + f.base_cmd("x") + " --steps=2 --eval-every-n-steps=0 --gpus=2 --continue");
    ASSERT_EQ(again.exit_code, 0) << again.output;
    EXPECT_TRUE(fs::exists(f.dir / "x/model.safetensors"));
}
