// LoRA with several ranks through `train` on the CPU (issue 33; threads mode, --gpus=N): N ranks with
// accumulation A equal one rank with N x A on the same global batch, dropout included (each rank draws
// the masks of the global micro-batches it trains): losses, norms and the output adapter to fp32
// rounding (the tolerances of train_cli_threads_test); --continue from a checkpoint of 2 ranks (the
// adapters written once) is bit-exact, and at another number of ranks with the same micro-batches per
// step continues the uninterrupted run's losses; ZeRO-2 and 3 give ZeRO-1's bits.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/train_cli_fixture.h"
#include "train/train_cli_ranks.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;
namespace fs = std::filesystem;

namespace {

const std::string kLimit = "timeout 120 ";
// epsilon 1e-2: Adam's update a smooth function of the gradient, so the other order of the micro-batch
// additions stays at fp32 rounding instead of becoming +-lr on elements whose gradient is ~0
const std::string kLora = " --lora-rank=4 --lora-alpha=8 --lora-dropout=0.2 --adam-epsilon=1e-2 --learning-rate=1e-2";

}  // namespace

TEST(TrainCliLoraRanks, RanksEqualOneRankOnTheSameGlobalBatch) {
    Fixture f;
    const std::string common = " --steps=6 --eval-every-n-steps=0 --grad-clip=0.05" + kLora;
    for (int world : {2, 3}) {
        SCOPED_TRACE("--gpus=" + std::to_string(world));
        std::vector<double> norm_a;
        ASSERT_NO_FATAL_FAILURE(expect_ranks_equal_one_rank(f, kLimit, common, world, 6,
                                                            std::to_string(world) + " CPU ranks, ZeRO-1", &norm_a));
        for (int s = 0; s < 6; ++s) EXPECT_GT(norm_a[s], 0.05) << "clipping must be exercised";
        const std::string one = "one" + std::to_string(world), many = "many" + std::to_string(world);
        // the PEFT adapter of the N-rank run is the one-rank run's
        const std::string adapter = "/adapter_model.safetensors";
        EXPECT_FALSE(fs::exists(f.dir / (many + "/model.safetensors")));
        EXPECT_LE(relative_weight_difference(read_all_weights(f.dir / (one + adapter)),
                                             read_all_weights(f.dir / (many + adapter))),
                  1e-5);
        EXPECT_EQ(read_file(f.dir / (one + "/adapter_config.json")), read_file(f.dir / (many + "/adapter_config.json")));
    }
}

// --continue of a 2-rank LoRA run from its adapter-only checkpoint: bit for bit (losses and the merged
// export), the dropout masks included.
TEST(TrainCliLoraRanks, ContinueIsBitExact) {
    Fixture f;
    expect_continue_reproduces_full_run(f, "cpu", " --gpus=2 --grad-accumulation=1 --merge-lora" + kLora, kLimit);
    const auto state = nlohmann::json::parse(read_file(f.dir / "part-ckpt/step_00000005/state.json"));
    EXPECT_EQ(state["world_size"], 2);
    EXPECT_TRUE(state["files"].contains("adapter_model.safetensors")) << state.dump(2);
}

// The checkpoint of 2 ranks x 2 micro-batches continues as 1 x 4 and 4 x 1 with the uninterrupted
// run's losses (the same sequences and masks per step, summed in another order).
TEST(TrainCliLoraRanks, CheckpointResumesAtAnotherNumberOfRanks) {
    Fixture f;
    const std::string common = " --eval-every-n-steps=0 --ckpt-interval=3 --steps=6" + kLora;
    auto whole = run_command(kLimit + f.base_cmd("ws") + common + " --gpus=2 --grad-accumulation=2");
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    const auto reference = step_losses(f.dir / "ws/log.jsonl");
    ASSERT_EQ(reference.size(), 6u);
    for (auto [ranks, accum] : {std::pair{1, 4}, std::pair{4, 1}}) {
        const std::string name = "r" + std::to_string(ranks);
        SCOPED_TRACE(name);
        ASSERT_NO_FATAL_FAILURE(expect_resume_at_ranks(f, kLimit, common, name, ranks, accum, 3, 6, reference));
        EXPECT_LE(relative_weight_difference(read_all_weights(f.dir / "ws/adapter_model.safetensors"),
                                             read_all_weights(f.dir / (name + "/adapter_model.safetensors"))),
                  1e-5);
    }
}

// --zero-level=2 and 3 with LoRA (ZeRO-2 of the adapters; the CPU model keeps the base whole at 3):
// the losses and the exported PEFT adapter are ZeRO-1's bit for bit, --train-also=norms included, and
// --continue from a ZeRO-3 checkpoint is bit-exact.
TEST(TrainCliLoraRanks, ZeroTwoAndThreeGiveZeroOnesBits) {
    Fixture f;
    const std::string common = " --steps=4 --eval-every-n-steps=0 --grad-clip=0.05 --gpus=2 --train-also=norms" + kLora;
    std::vector<std::string> adapters;
    std::vector<std::vector<double>> losses;
    for (const char* zero : {"1", "2", "3"}) {
        const std::string name = std::string("z") + zero;
        auto r = run_command(kLimit + f.base_cmd(name) + common + " --zero-level=" + zero);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        losses.push_back(step_losses(f.dir / (name + "/log.jsonl")));
        adapters.push_back(read_file(f.dir / (name + "/adapter_model.safetensors")));
    }
    ASSERT_EQ(losses[0].size(), 4u);
    for (int z = 1; z < 3; ++z) {
        SCOPED_TRACE("--zero-level=" + std::to_string(z + 1));
        EXPECT_EQ(losses[z], losses[0]);
        EXPECT_EQ(adapters[z], adapters[0]) << "the exported adapter differs from ZeRO-1's";
    }
}

TEST(TrainCliLoraRanks, ContinueAtZeroThreeIsBitExact) {
    Fixture f;
    expect_continue_reproduces_full_run(f, "cpu", " --gpus=2 --zero-level=3 --grad-accumulation=1 --merge-lora" + kLora,
                                        kLimit);
}
