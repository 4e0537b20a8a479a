// LoRA on the GPU model in data parallel (issue 33; CudaModel::set_communicator with a frozen base):
// W ranks as threads on one GPU (the copy-engine communicator, as data_parallel_test.cpp), each with
// A micro-batches, against one plain model with W x A micro-batches of the same data in the global
// order (rank r trains micro-batch j * W + r). Every rank holds the whole frozen base and the adapters'
// model-dtype weights, and the master and moments of its block of them (ZeRO-1/2 of the adapters);
// after each step's all-gather every rank ends with the same bits (ZeRO-2 with ZeRO-1's), and
// with dropout each rank draws the masks of the global micro-batch it trains (lora_adapters.h
// end_pass). Against one rank: losses, norms and adapters within data_parallel_test's bounds of the
// same dtype (fp32 tightly, bf16 within bf16 noise), with recompute and CUDA graphs too. A checkpoint
// of 2 ranks (the CPU model's adapter files, written once by rank 0) resumes bit for bit. With
// --train-also the trained norms / embeddings ride along (their gradient in the adapters' space).
// (ZeRO-3 of the frozen base: cuda_lora_zero3_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda_lora_ranks_util.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::lora_ranks;

namespace {

// The smallest cosine over the adapter tensors of two concatenated sets.
double worst_adapter_cosine(const Mode& mode, const std::vector<float>& a, const std::vector<float>& b,
                            std::string* where) {
    // (the host mirror's order: the adapters, then --train-also's tensors)
    std::vector<ParamSpec> specs = lora_parameters(mode.config(), options(mode).lora);
    for (ParamSpec& s : lora_train_also_parameters(mode.config(), options(mode).lora)) specs.push_back(std::move(s));
    double worst = 1.0;
    std::size_t at = 0;
    for (const ParamSpec& s : specs) {
        const std::vector<float> x(a.begin() + at, a.begin() + at + s.numel()), y(b.begin() + at, b.begin() + at + s.numel());
        at += s.numel();
        const double c = cosine(x, y);
        if (!(c >= worst)) worst = c, *where = s.name;
    }
    return worst;
}

}  // namespace

class CudaLoraDataParallel : public ::testing::TestWithParam<int> {};

TEST_P(CudaLoraDataParallel, RanksOnOneGpuEqualOneRankOnTheSameGlobalBatch) {
    QTRAIN_REQUIRE_GPU();
    const Mode& mode = kModes[GetParam()];
    for (int world : {2, 3}) {
        SCOPED_TRACE(std::string(mode.name) + ", " + std::to_string(world) + " ranks");
        constexpr int kMicro = 2;
        const LoraRun one = run(mode, 0, world * kMicro);
        const LoraRun many = run(mode, world, kMicro);
        for (int r = 1; r < world; ++r) {
            EXPECT_TRUE(same_bits(many.adapters[r], many.adapters[0])) << "rank " << r << " holds other adapters";
            EXPECT_TRUE(same_bits(many.moments[r], many.moments[0])) << "rank " << r << " holds other moments";
        }
        double worst_loss = 0;
        for (int s = 0; s < kSteps; ++s) {
            worst_loss = std::max(worst_loss, std::abs(double(many.losses[s]) - one.losses[s]) / std::abs(one.losses[s]));
            EXPECT_NEAR(many.norms[s], one.norms[s], 1e-2 * one.norms[s] + 1e-6) << "step " << s;
        }
        std::string where;
        const double cos = worst_adapter_cosine(mode, many.adapters[0], one.adapters[0], &where);
        std::printf("[lora dp %s, %d ranks] vs 1 rank: worst loss rel diff %.2e (loss %.5f -> %.5f), worst adapter "
                    "cosine %.7f (%s)\n",
                    mode.name, world, worst_loss, one.losses.front(), one.losses.back(), cos, where.c_str());
        EXPECT_LE(worst_loss, mode.loss_rel);
        EXPECT_GE(cos, mode.min_cosine) << where;
        // the adapters moved (a test of equal no-ops would pass too)
        std::string moved_where;
        EXPECT_LT(worst_adapter_cosine(mode, one.adapters[0], one.initial, &moved_where), mode.min_cosine);
    }
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaLoraDataParallel, ::testing::Range(0, static_cast<int>(std::size(kModes))),
                         [](const ::testing::TestParamInfo<int>& i) { return "mode" + std::to_string(i.param); });

// ZeRO-2 of the adapters (lora_adapters.h): their gradient reduce-scattered to the blocks' owners
// instead of all-reduced, the same block norms, block AdamW and weight all-gather: ZeRO-1's bits on
// every rank, in every mode (dropout, --train-also, recompute and CUDA graphs), at 2 and 3 ranks,
// and on the FP8 base. Against a run with another learning rate at one step, so the comparison can fail.
TEST_P(CudaLoraDataParallel, ZeroTwoGivesZeroOnesBits) {
    QTRAIN_REQUIRE_GPU();
    const Mode& mode = kModes[GetParam()];
    for (int world : {2, 3})
        for (bool fp8 : {false, true}) {
            if (fp8 && mode.act != DType::BF16) continue;  // (the FP8 base is a bf16 model's)
            SCOPED_TRACE(std::string(mode.name) + " world " + std::to_string(world) + (fp8 ? " FP8 base" : ""));
            const LoraRun one = run(mode, world, 2, 1, fp8), two = run(mode, world, 2, 2, fp8);
            EXPECT_TRUE(same_bits(one.losses, two.losses));
            EXPECT_TRUE(same_bits(one.norms, two.norms));
            for (int r = 0; r < world; ++r) {
                EXPECT_TRUE(same_bits(one.adapters[r], two.adapters[r])) << "rank " << r;
                EXPECT_TRUE(same_bits(one.moments[r], two.moments[r])) << "rank " << r;
                EXPECT_TRUE(same_bits(two.adapters[r], two.adapters[0])) << "rank " << r << " holds other adapters";
            }
            EXPECT_FALSE(same_bits(one.adapters[0], run(mode, world, 1, 2, fp8).adapters[0]))
                << "another accumulation gave the same bits: the comparison cannot fail";
        }
}

// A checkpoint of 2 ranks after 2 steps: the adapters and their moments in the CPU model's files,
// written once (by rank 0), with the global pass count; 2 ranks resumed from it continue bit for bit
// (dropout's masks included), and the CPU model reads it.
TEST(CudaLoraDataParallelGpu, CheckpointOfTwoRanksResumesBitExact) {
    QTRAIN_REQUIRE_GPU();
    const Mode& mode = kModes[4];  // bf16, dropout, recompute, CUDA graphs
    // written at ZeRO-1 and resumed at ZeRO-1; written at ZeRO-2 (every rank's block gathered) and
    // resumed at ZeRO-1 and at ZeRO-2: the state is whole in the files, so every pair continues alike
    for (const auto [save_level, load_level] : {std::pair{1, 1}, {2, 1}, {2, 2}}) {
    SCOPED_TRACE("saved at ZeRO-" + std::to_string(save_level) + ", resumed at ZeRO-" + std::to_string(load_level));
    const ModelConfig cfg = mode.config();
    TempDir tmp;
    const std::string dir = (tmp.path / "ckpt").string();
    std::filesystem::create_directories(dir);
    ModelOptions two = options(mode);
    two.gpus = 2;
    const auto [whole, resumed, passes] = checkpoint_and_resume(cfg, two, save_level, two, load_level, dir);
    EXPECT_TRUE(same_bits(whole.losses, resumed.losses));
    EXPECT_TRUE(same_bits(whole.norms, resumed.norms));
    for (int r = 0; r < 2; ++r) {
        EXPECT_TRUE(same_bits(whole.adapters[r], resumed.adapters[r])) << "rank " << r;
        EXPECT_TRUE(same_bits(whole.moments[r], resumed.moments[r])) << "rank " << r;
        EXPECT_EQ(passes[r], 2u * 2u * 2u) << "the global pass count: 2 steps of 2 ranks x 2 micro-batches";
    }
    // the CPU model reads the 2-rank checkpoint: the adapters and the pass count
    CpuModel cpu(cfg, [&] {
        ModelOptions o = CpuModel::fp32_options(kB, kT);
        o.lora = options(mode).lora;
        return o;
    }());
    cpu.init_random(42);
    cpu.load_checkpoint(dir);
    EXPECT_EQ(cpu.lora().passes(), 8u);
    }
}
