// A block checkpoint through `train` on the CPU: the state of a CPU run's checkpoint cut into the
// blocks a 3-rank GPU run writes (the GPU model's flat layout, tests/block_checkpoint_util.h) exports
// the same HF model byte for byte (--export-checkpoint) and resumes the same run bit for bit
// (--continue: the CPU model reads GPU blocks) as the named checkpoint it came from; one that lacks a
// block is refused before the model takes any memory, naming the block.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "block_checkpoint_util.h"
#include "model/checkpoint_layout.h"
#include "test_util.h"
#include "train/checkpointer.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;
namespace fs = std::filesystem;

namespace {

const std::string kLimit = "timeout 120 ";
const std::string kCommon = " --steps=8 --ckpt-interval=4 --eval-every-n-steps=0";

// `named`'s state as the blocks of `world` GPU ranks in `dir` (state.json with checksums and shards).
void write_as_blocks(const std::string& named, const std::string& dir, int world) {
    fs::create_directories(dir);
    fs::copy_file(named + "/state.json", dir + "/state.json");
    const ModelConfig cfg = parse_model_config(read_checkpoint_state(named).config_json, named);
    const FlatLayout gpu = gpu_checkpoint_layout(cfg);
    write_blocks(dir, flat_arrays_of_named(named, gpu), gpu.total, shard_ranges(gpu.total, world),
                 {.piece = 4096, .layout = gpu.fingerprint()});
    refresh_state_json(dir);
}

}  // namespace

TEST(TrainCliBlockCheckpoint, ExportsAndResumesAsTheNamedCheckpointOfTheSameState) {
    Fixture f;
    auto run = run_command(kLimit + f.base_cmd("run") + kCommon);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const auto reference = step_losses(f.dir / "run/log.jsonl");
    ASSERT_EQ(reference.size(), 8u);
    const std::string named = f.dir / "run-ckpt/step_00000004", blocks = f.dir / "blocks-ckpt/step_00000004";
    write_as_blocks(named, blocks, 3);
    ASSERT_TRUE(fs::exists(blocks + "/block-00002-of-00003.safetensors"));
    ASSERT_FALSE(fs::exists(blocks + "/model.safetensors"));
    EXPECT_TRUE(nlohmann::json::parse(read_file(blocks + "/state.json")).contains("shards"));

    auto from_named = run_command(train_exe() + " --export-checkpoint=" + named + " --out-dir=" + (f.dir / "e-named"));
    auto from_blocks = run_command(train_exe() + " --export-checkpoint=" + blocks + " --out-dir=" + (f.dir / "e-blocks"));
    ASSERT_EQ(from_named.exit_code, 0) << from_named.output;
    ASSERT_EQ(from_blocks.exit_code, 0) << from_blocks.output;
    EXPECT_TRUE(Contains(from_blocks.output, "3 blocks")) << from_blocks.output;
    EXPECT_TRUE(Contains(from_blocks.output, "checksums verified")) << from_blocks.output;
    EXPECT_EQ(read_file(f.dir / "e-named/model.safetensors"), read_file(f.dir / "e-blocks/model.safetensors"));
    EXPECT_EQ(read_file(f.dir / "e-named/config.json"), read_file(f.dir / "e-blocks/config.json"));

    // the CPU model resumes from the blocks: the same state, so the uninterrupted run's losses exactly
    auto resumed = run_command(kLimit + f.base_cmd("blocks") + kCommon + " --continue");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    int first = -1;
    const auto losses = step_losses(f.dir / "blocks/log.jsonl", &first);
    EXPECT_EQ(first, 4);
    ASSERT_EQ(losses.size(), 4u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(losses[i], reference[4 + i]) << "step " << 4 + i;

    // a lost block, in a checkpoint without checksums (as older qtrain wrote them): refused up front
    const std::string broken = f.dir / "broken-ckpt/step_00000004";
    write_as_blocks(named, broken, 3);
    fs::remove(broken + "/block-00001-of-00003.safetensors");
    auto j = nlohmann::json::parse(read_file(broken + "/state.json"));
    j.erase("files");
    write_file(broken + "/state.json", j.dump());
    auto refused = run_command(kLimit + f.base_cmd("broken") + kCommon + " --continue");
    EXPECT_EQ(refused.exit_code, 1) << refused.output;
    EXPECT_TRUE(Contains(refused.output, "cannot be loaded")) << refused.output;
    EXPECT_TRUE(Contains(refused.output, "lacks the block of rank 1 of 3 (block-00001-of-00003.safetensors"))
        << refused.output;
    EXPECT_FALSE(Contains(refused.output, "[T] step")) << refused.output;
}
