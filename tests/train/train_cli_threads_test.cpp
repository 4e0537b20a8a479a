// Threads mode through `train` (issue 18): --gpus=N on the CPU model runs N data-parallel ranks as
// threads. N ranks with accumulation A equal one rank with N x A (the same chunks in the same global
// order; only the order of the micro-batch additions differs), ZeRO-1 and ZeRO-2 are bit-identical,
// and --continue at the same N resumes bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "io/safetensors.h"
#include "test_util.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;

namespace {

std::vector<float> read_all(const std::string& path) {
    SafeTensorsReader r({path});
    std::vector<float> out;
    for (const auto& name : r.names()) {
        const Tensor t = r.view(name);
        std::vector<float> v(t.numel());
        r.read_f32(name, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim), v.data());
        out.insert(out.end(), v.begin(), v.end());
    }
    return out;
}

}  // namespace

TEST(TrainCliThreads, RanksEqualOneRankWithTheirAccumulation) {
    Fixture f;
    const std::string common = " --steps=8 --eval-every-n-steps=0 --grad-clip=0.3";
    for (int world : {2, 3}) {
        SCOPED_TRACE("--gpus=" + std::to_string(world));
        const std::string one = "one" + std::to_string(world), many = "many" + std::to_string(world);
        auto a = run_command(f.base_cmd(one) + common + " --grad-accumulation=" + std::to_string(2 * world));
        auto b = run_command(f.base_cmd(many) + common + " --grad-accumulation=2 --gpus=" + std::to_string(world));
        ASSERT_EQ(a.exit_code, 0) << a.output;
        ASSERT_EQ(b.exit_code, 0) << b.output;
        EXPECT_TRUE(Contains(b.output, "threads mode: " + std::to_string(world) + " CPU ranks")) << b.output;
        const auto la = step_losses(f.dir / (one + "/log.jsonl")), lb = step_losses(f.dir / (many + "/log.jsonl"));
        ASSERT_EQ(la.size(), 8u);
        ASSERT_EQ(lb.size(), 8u);
        for (int s = 0; s < 8; ++s) EXPECT_NEAR(lb[s], la[s], 1e-6 * std::abs(la[s])) << "step " << s;
        const auto wa = read_all(f.dir / (one + "/model.safetensors")), wb = read_all(f.dir / (many + "/model.safetensors"));
        ASSERT_EQ(wa.size(), wb.size());
        double max_w = 0, max_d = 0;
        for (size_t i = 0; i < wa.size(); ++i) {
            max_w = std::max(max_w, std::abs(static_cast<double>(wa[i])));
            max_d = std::max(max_d, std::abs(static_cast<double>(wb[i]) - wa[i]));
        }
        EXPECT_LE(max_d, 1e-5 * max_w);
    }
}

TEST(TrainCliThreads, ZeroLevelsOneAndTwoAreBitIdentical) {
    Fixture f;
    const std::string common = " --steps=6 --eval-every-n-steps=0 --grad-accumulation=2 --gpus=2";
    auto z1 = run_command(f.base_cmd("z1") + common + " --zero-level=1");
    auto z2 = run_command(f.base_cmd("z2") + common + " --zero-level=2");
    ASSERT_EQ(z1.exit_code, 0) << z1.output;
    ASSERT_EQ(z2.exit_code, 0) << z2.output;
    EXPECT_EQ(step_losses(f.dir / "z1/log.jsonl"), step_losses(f.dir / "z2/log.jsonl"));
    EXPECT_EQ(read_file(f.dir / "z1/model.safetensors"), read_file(f.dir / "z2/model.safetensors"));
}

TEST(TrainCliThreads, ContinueReproducesTheUninterruptedRunExactly) {
    Fixture f;
    expect_continue_reproduces_full_run(f, "cpu", " --gpus=2 --grad-accumulation=1");
}
