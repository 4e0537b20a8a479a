// The CPU reference model in data parallel (issue 18): W ranks as threads, each with A micro-batches,
// against one model with W x A micro-batches of the same data: the same losses and norms to fp32
// rounding (only the order of the micro-batch additions differs), ZeRO-1 and ZeRO-2 bit-identical,
// and every rank holding the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "comm/run_ranks.h"
#include "model/cpu/cpu_model.h"
#include "model/cpu_test_util.h"

using namespace qtrain;

namespace {

constexpr int kB = 2, kT = 16, kA = 2, kSteps = 4;

struct Trajectory {
    std::vector<float> losses, norms, params;
};

test::TokenBatch micro_batch(int step, int m, int vocab) { return test::random_batch(kB, kT, vocab, 1000 * step + m, 5); }

OptimizerParams params_for(int step) {
    OptimizerParams o;
    o.learning_rate = 3e-3f;
    o.weight_decay = 0.1f;
    o.grad_clip = 0.3f;  // the norms are above it: clipping is exercised
    o.step = step;
    return o;
}

std::vector<float> all_params(CpuModel& m) {
    std::vector<float> out;
    for (const auto& s : m.params()) out.insert(out.end(), m.param(s.name), m.param(s.name) + s.numel());
    return out;
}

Trajectory single(const ModelConfig& cfg, int world) {
    CpuModel m(cfg, CpuModel::fp32_options(kB, kT));
    m.init_random(3);
    Trajectory run;
    const int micro = kA * world;
    for (int step = 1; step <= kSteps; ++step) {
        for (int k = 0; k < micro; ++k) m.forward_backward(micro_batch(step, k, cfg.vocab_size).view(), 1.0f / micro);
        const StepStats s = m.optimizer_step(params_for(step));
        run.losses.push_back(s.loss);
        run.norms.push_back(s.grad_norm);
    }
    run.params = all_params(m);
    return run;
}

// Rank r runs micro-batches j * W + r (the global order of DataLoader::set_rank).
std::vector<Trajectory> parallel(const ModelConfig& cfg, int world, int zero_level) {
    std::vector<Trajectory> runs(world);
    comm::run_ranks(world, [&](comm::Communicator& c) {
        CpuModel m(cfg, CpuModel::fp32_options(kB, kT));
        m.init_random(3);
        m.set_communicator(&c, zero_level);
        Trajectory& run = runs[c.rank()];
        for (int step = 1; step <= kSteps; ++step) {
            for (int j = 0; j < kA; ++j)
                m.forward_backward(micro_batch(step, j * world + c.rank(), cfg.vocab_size).view(), 1.0f / (kA * world));
            const StepStats s = m.optimizer_step(params_for(step));
            run.losses.push_back(s.loss);
            run.norms.push_back(s.grad_norm);
        }
        run.params = all_params(m);
    });
    return runs;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(CpuModelDataParallel, RanksEqualOneModelWithTheirAccumulationAndZeroLevelsAgreeBitForBit) {
    ModelConfig cfg = test::tiny_config(false);
    for (int world : {2, 3}) {
        SCOPED_TRACE("world " + std::to_string(world));
        const Trajectory ref = single(cfg, world);
        const std::vector<Trajectory> z1 = parallel(cfg, world, 1), z2 = parallel(cfg, world, 2);
        for (int r = 0; r < world; ++r) {
            EXPECT_TRUE(same_bits(z1[r].params, z1[0].params)) << "rank " << r << " holds other weights (ZeRO-1)";
            EXPECT_TRUE(same_bits(z2[r].params, z2[0].params)) << "rank " << r << " holds other weights (ZeRO-2)";
            EXPECT_EQ(z1[r].losses, z1[0].losses);
        }
        EXPECT_TRUE(same_bits(z1[0].params, z2[0].params)) << "ZeRO-1 and ZeRO-2 differ";
        EXPECT_EQ(z1[0].losses, z2[0].losses);
        EXPECT_EQ(z1[0].norms, z2[0].norms);
        for (int s = 0; s < kSteps; ++s) {
            EXPECT_NEAR(z1[0].losses[s], ref.losses[s], 1e-6 * std::abs(ref.losses[s])) << "step " << s;
            EXPECT_NEAR(z1[0].norms[s], ref.norms[s], 1e-6 * std::abs(ref.norms[s])) << "step " << s;
            EXPECT_GT(ref.norms[s], params_for(s + 1).grad_clip) << "clipping must be exercised";
        }
        double max_w = 0, max_d = 0;
        for (size_t i = 0; i < ref.params.size(); ++i) {
            max_w = std::max(max_w, std::abs(static_cast<double>(ref.params[i])));
            max_d = std::max(max_d, std::abs(static_cast<double>(z1[0].params[i]) - ref.params[i]));
        }
        EXPECT_LE(max_d, 1e-5 * max_w) << "weights after " << kSteps << " steps";
    }
}

// A broken step on one rank (its gradient NaN) is broken on every rank: none updates.
TEST(CpuModelDataParallel, ABrokenStepOnOneRankStopsEveryRanksUpdate) {
    ModelConfig cfg = test::tiny_config(false);
    std::vector<int> allowed(2, -1);
    std::vector<float> before0, after0;
    comm::run_ranks(2, [&](comm::Communicator& c) {
        CpuModel m(cfg, CpuModel::fp32_options(kB, kT));
        m.init_random(3);
        m.set_communicator(&c, 2);
        m.forward_backward(micro_batch(1, c.rank(), cfg.vocab_size).view(), 0.5f);
        if (c.rank() == 1) m.grad(m.params()[2].name)[0] = std::nanf("");
        const std::vector<float> before = all_params(m);
        const StepStats s = m.optimizer_step(params_for(1));
        allowed[c.rank()] = IModel::update_allowed(s);
        EXPECT_TRUE(same_bits(before, all_params(m))) << "rank " << c.rank() << " updated in a broken step";
    });
    EXPECT_EQ(allowed[0], 0);
    EXPECT_EQ(allowed[1], 0);
}
