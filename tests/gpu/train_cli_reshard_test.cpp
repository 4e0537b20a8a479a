// Resharding through `train` on one GPU: a --gpus=2 run's checkpoint (blocks of 2 ranks) continues with
// --continue on 1 rank (--grad-accumulation doubled) and on 3 ranks of the same GPU, keeping the 6
// micro-batches per step; and --export-checkpoint of its last checkpoint writes the run's own export,
// byte for byte. The first resumed step has the uninterrupted run's loss to fp32 rounding (the loaded
// weights are the same bits, only the 6-term sum runs in another order); the later ones stay within
// bf16 noise of it (2e-3, as train_cli_data_parallel_test.cpp's 2 ranks vs 1). The same for a ZeRO-3
// run's checkpoint, resumed by one plain rank and by three ZeRO-3 ranks.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "gpu_test_util.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;
namespace fs = std::filesystem;

TEST(TrainCliGpuReshard, TwoRankCheckpointContinuesOnOneAndThreeRanksAndExports) {
    QTRAIN_REQUIRE_GPU();
    const std::string limit = "timeout 300 ";
    // ZeRO-1, and ZeRO-3 (its blocks resumed by ZeRO-1 on one rank and ZeRO-3 on three; its export is
    // the collective one, which the export of its blocks must equal byte for byte)
    for (const std::string zero : {"", " --zero-level=3"}) {
    SCOPED_TRACE(zero);
    Fixture f(kGpuShape);
    const std::string common = " --steps=10 --eval-every-n-steps=0 --ckpt-interval=5";
    auto whole = run_command(limit + f.base_cmd("ws", "cuda") + common + zero +
                             " --gpus=2 --gpu-ids=0,0 --memcpy-all-gather --grad-accumulation=3");
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    const auto reference = step_losses(f.dir / "ws/log.jsonl");
    ASSERT_EQ(reference.size(), 10u);
    const auto state = nlohmann::json::parse(read_file(f.dir / "ws-ckpt/step_00000005/state.json"));
    EXPECT_EQ(state["world_size"], 2);
    ASSERT_TRUE(state.contains("shards")) << state.dump(2);
    EXPECT_EQ(state["shards"]["world"], 2);
    EXPECT_EQ(state["shards"]["blocks"][1]["file"], "block-00001-of-00002.safetensors");

    auto exported = run_command(train_exe() + " --export-checkpoint=" + (f.dir / "ws-ckpt/step_00000010") +
                                " --out-dir=" + (f.dir / "exported"));
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
    EXPECT_TRUE(Contains(exported.output, "2 blocks")) << exported.output;
    EXPECT_EQ(read_file(f.dir / "exported/model.safetensors"), read_file(f.dir / "ws/model.safetensors"));
    EXPECT_EQ(read_file(f.dir / "exported/config.json"), read_file(f.dir / "ws/config.json"));

    for (auto [ranks, flags] : {std::pair{1, std::string(" --grad-accumulation=6")},
                                std::pair{3, std::string(" --grad-accumulation=2 --gpus=3 --gpu-ids=0,0,0 "
                                                         "--memcpy-all-gather") + zero}}) {
        const std::string name = "r" + std::to_string(ranks);
        SCOPED_TRACE(name);
        fs::copy(f.dir / "ws-ckpt", f.dir / (name + "-ckpt"), fs::copy_options::recursive);
        fs::remove_all(f.dir / (name + "-ckpt/step_00000010"));
        auto resumed = run_command(limit + f.base_cmd(name, "cuda") + common + " --continue" + flags);
        ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
        EXPECT_TRUE(Contains(resumed.output, "the same 6 micro-batches per step")) << resumed.output;
        EXPECT_TRUE(Contains(resumed.output, "(resharding)")) << resumed.output;
        int first = -1;
        const auto losses = step_losses(f.dir / (name + "/log.jsonl"), &first);
        EXPECT_EQ(first, 5);
        ASSERT_EQ(losses.size(), 5u);
        EXPECT_NEAR(losses[0], reference[5], 1e-6 * reference[5]) << "the first resumed step";
        for (int i = 0; i < 5; ++i) EXPECT_NEAR(losses[i], reference[5 + i], 2e-3 * reference[5 + i]) << "step " << 5 + i;
    }
    }
}

// The same resharding for the other families of the architecture description (issue 30): a ZeRO-3
// run of 2 ranks of a Qwen3 config (head_dim 128 != hidden/heads, q/k norms) and of a Llama 3 config
// (llama3 RoPE, untied) continues on 1 plain rank and on 3 ZeRO-3 ranks with the uninterrupted run's
// losses, and the export of its blocks equals the run's own export byte for byte.
TEST(TrainCliGpuReshard, QwenThreeAndLlamaBlocksContinueOnOneAndThreeRanks) {
    QTRAIN_REQUIRE_GPU();
    const std::string limit = "timeout 300 ";
    const std::pair<const char*, const char*> families[] = {
        {"Qwen3ForCausalLM", R"("architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128)"},
        {"LlamaForCausalLM", kLlamaFamily}};
    for (const auto& [hf_class, fields] : families) {
        SCOPED_TRACE(hf_class);
        Fixture f(kGpuShape, fields);
        const std::string common = " --steps=8 --eval-every-n-steps=0 --ckpt-interval=4";
        auto whole = run_command(limit + f.base_cmd("ws", "cuda") + common +
                                 " --zero-level=3 --gpus=2 --gpu-ids=0,0 --memcpy-all-gather --grad-accumulation=3");
        ASSERT_EQ(whole.exit_code, 0) << whole.output;
        const auto reference = step_losses(f.dir / "ws/log.jsonl");
        ASSERT_EQ(reference.size(), 8u);
        const auto state = nlohmann::json::parse(read_file(f.dir / "ws-ckpt/step_00000004/state.json"));
        ASSERT_TRUE(state.contains("shards")) << state.dump(2);
        EXPECT_EQ(state["shards"]["world"], 2);

        auto exported = run_command(train_exe() + " --export-checkpoint=" + (f.dir / "ws-ckpt/step_00000008") +
                                    " --out-dir=" + (f.dir / "exported"));
        ASSERT_EQ(exported.exit_code, 0) << exported.output;
        EXPECT_EQ(read_file(f.dir / "exported/model.safetensors"), read_file(f.dir / "ws/model.safetensors"));
        const auto cfg = nlohmann::json::parse(read_file(f.dir / "exported/config.json"));
        EXPECT_EQ(cfg["architectures"][0], hf_class);

        for (auto [ranks, flags] : {std::pair{1, std::string(" --grad-accumulation=6")},
                                    std::pair{3, std::string(" --grad-accumulation=2 --gpus=3 --gpu-ids=0,0,0 "
                                                             "--memcpy-all-gather --zero-level=3")}}) {
            const std::string name = "r" + std::to_string(ranks);
            SCOPED_TRACE(name);
            fs::copy(f.dir / "ws-ckpt", f.dir / (name + "-ckpt"), fs::copy_options::recursive);
            fs::remove_all(f.dir / (name + "-ckpt/step_00000008"));
            auto resumed = run_command(limit + f.base_cmd(name, "cuda") + common + " --continue" + flags);
            ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
            EXPECT_TRUE(Contains(resumed.output, "(resharding)")) << resumed.output;
            int first = -1;
            const auto losses = step_losses(f.dir / (name + "/log.jsonl"), &first);
            EXPECT_EQ(first, 4);
            ASSERT_EQ(losses.size(), 4u);
            EXPECT_NEAR(losses[0], reference[4], 1e-6 * reference[4]) << "the first resumed step";
            for (int i = 0; i < 4; ++i) EXPECT_NEAR(losses[i], reference[4 + i], 2e-3 * reference[4 + i]) << "step " << 4 + i;
        }
    }
}
