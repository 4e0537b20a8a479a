// The CPU model loads the GPU model's block checkpoints (the blocks of its flat layout, any number of
// ranks: io/flat_state_reader.h), so a GPU run resumes on the CPU. The blocks are made from a CPU
// checkpoint (tests/block_checkpoint_util.h), so the loaded state must be the saved one bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "block_checkpoint_util.h"
#include "cpu_test_util.h"
#include "model/checkpoint_layout.h"

using namespace qtrain;
using namespace qtrain::test;
namespace fs = std::filesystem;

namespace {

const OptimizerParams kAdam{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};

float step(CpuModel& m, int k) {
    for (int micro = 0; micro < 2; ++micro)
        m.forward_backward(random_batch(2, 8, m.config().vocab_size, 100 * k + micro).view(), 0.5f);
    OptimizerParams p = kAdam;
    p.step = k;
    return m.optimizer_step(p).loss;
}

// Every tensor's weights, m and v equal, bit for bit.
void expect_same_state(CpuModel& a, CpuModel& b) {
    for (const auto& s : a.params()) {
        const std::size_t bytes = sizeof(float) * s.numel();
        EXPECT_EQ(0, std::memcmp(a.param(s.name), b.param(s.name), bytes)) << s.name;
        EXPECT_EQ(0, std::memcmp(a.adam_m(s.name), b.adam_m(s.name), bytes)) << s.name;
        EXPECT_EQ(0, std::memcmp(a.adam_v(s.name), b.adam_v(s.name), bytes)) << s.name;
    }
}

}  // namespace

TEST(CpuModelBlockCheckpoint, LoadsTheGpuModelsBlocksOfAnyWorldSize) {
    for (bool tied : {false, true}) {
        SCOPED_TRACE(tied ? "tied" : "untied");
        TempDir dir;
        const ModelConfig cfg = tiny_config(tied);
        CpuModel a(cfg, CpuModel::fp32_options(2, 8));
        a.init_random(5);
        step(a, 1);
        step(a, 2);
        a.save_checkpoint(dir / "named");
        const FlatLayout gpu = gpu_checkpoint_layout(cfg);
        const FlatArrays state = flat_arrays_of_named(dir / "named", gpu);
        const float next = step(a, 3);
        for (int world : {2, 3}) {
            SCOPED_TRACE(world);
            const std::string blocks = dir / ("w" + std::to_string(world));
            write_blocks(blocks, state, gpu.total, shard_ranges(gpu.total, world),
                         {.piece = 1000, .layout = gpu.fingerprint()});
            CpuModel b(cfg, CpuModel::fp32_options(2, 8));
            b.init_random(9);  // other weights: the checkpoint must replace every one
            b.load_checkpoint(blocks);
            EXPECT_EQ(step(b, 3), next);
            expect_same_state(a, b);
        }
        // a missing block is an error naming it, and the model stays as it was
        fs::remove(dir / "w3/block-00001-of-00003.safetensors");
        CpuModel c(cfg, CpuModel::fp32_options(2, 8));
        c.init_random(9);
        auto weights = [](CpuModel& m) {
            std::vector<float> out;
            for (const auto& s : m.params()) out.insert(out.end(), m.param(s.name), m.param(s.name) + s.numel());
            return out;
        };
        const std::vector<float> before = weights(c);
        EXPECT_ERROR(c.load_checkpoint(dir / "w3"), "lacks the block of rank 1 of 3", "block-00001-of-00003");
        EXPECT_TRUE(before == weights(c));
    }
}
