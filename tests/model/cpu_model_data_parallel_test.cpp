// The CPU reference model in data parallel (issue 18): W ranks as threads, each with A micro-batches,
// against one model with W x A micro-batches of the same data: the same losses and norms to fp32
// rounding (only the order of the micro-batch additions differs), ZeRO-1 and ZeRO-2 bit-identical,
// and every rank holding the same bits. ZeRO-3 (issue 19): ZeRO-1's bits while each rank holds only
// its block between uses, the rest NaN, and a gather that does not arrive shows as a NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "comm/run_ranks.h"
#include "core/dtype.h"
#include "model/cpu/cpu_model.h"
#include "model/cpu_test_util.h"

using namespace qtrain;

namespace {

constexpr int kB = 2, kT = 16, kA = 2, kSteps = 4;

struct Trajectory {
    std::vector<float> losses, norms, params;
    std::vector<float> adam_m, adam_v;  // parallel(): after the steps
    std::pair<int64_t, int64_t> owned;  // parallel(): the rank's block
    float eval = 0, eval_ignored = -1;  // parallel(): evaluate() of a batch, and of one without targets
};

test::TokenBatch micro_batch(int step, int m, int vocab) { return test::random_batch(kB, kT, vocab, 1000 * step + m, 5); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

OptimizerParams params_for(int step) {
    OptimizerParams o;
    o.learning_rate = 3e-3f;
    o.weight_decay = 0.1f;
    o.grad_clip = 0.3f;  // the norms are above it: clipping is exercised
    o.step = step;
    return o;
}

// A flat buffer of the model in parameter order (= its flat layout): the weights, or Adam's m or v.
enum class State { Weights, M, V };
std::vector<float> all_of(CpuModel& m, State which) {
    std::vector<float> out;
    for (const auto& s : m.params()) {
        const float* p = which == State::Weights ? m.param(s.name) : which == State::M ? m.adam_m(s.name) : m.adam_v(s.name);
        out.insert(out.end(), p, p + s.numel());
    }
    return out;
}
std::vector<float> all_params(CpuModel& m) { return all_of(m, State::Weights); }

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

// Rank r runs micro-batches j * W + r (the global order of DataLoader::set_rank). After the steps
// every rank evaluates one batch and one whose targets are all ignored, and with `save_dir` writes a
// checkpoint into save_dir/ckpt and the HF model into save_dir/hf (save_hf on every rank under
// ZeRO-3, on rank 0 otherwise: what the trainer does).
std::vector<Trajectory> parallel(const ModelConfig& cfg, int world, int zero_level,
                                 const ModelOptions& options = CpuModel::fp32_options(kB, kT),
                                 const std::string& save_dir = "") {
    std::vector<Trajectory> runs(world);
    comm::run_ranks(world, [&](comm::Communicator& c) {
        CpuModel m(cfg, options);
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
        run.adam_m = all_of(m, State::M);
        run.adam_v = all_of(m, State::V);
        run.owned = m.owned_range();
        run.eval = m.evaluate(micro_batch(99, 0, cfg.vocab_size).view());
        test::TokenBatch none = micro_batch(99, 1, cfg.vocab_size);
        std::fill(none.targets.begin(), none.targets.end(), -1);
        run.eval_ignored = m.evaluate(none.view());
        if (!save_dir.empty()) {
            m.save_checkpoint(save_dir + "/ckpt");
            if (m.weights_sharded() || c.rank() == 0) m.save_hf(save_dir + "/hf");
        }
        EXPECT_TRUE(same_bits(run.params, all_params(m))) << "evaluating or saving changed what rank " << c.rank()
                                                           << " holds";
    });
    return runs;
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

namespace {

// Off the defaults where it costs nothing: the RoPE base and the RMSNorm epsilon (the q/k/v biases
// are Qwen2's own), tied or untied.
ModelConfig zero3_config(bool tied) {
    ModelConfig c = test::tiny_config(tied);
    c.rope_theta = 500000.0;
    c.rms_norm_eps = 1e-5;
    return c;
}

// `got` holds `want`'s bits inside [owned.first, owned.second) and NaN everywhere else.
::testing::AssertionResult holds_only_block(const std::vector<float>& got, const std::vector<float>& want,
                                            std::pair<int64_t, int64_t> owned, const char* what) {
    if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
    for (size_t i = 0; i < got.size(); ++i) {
        const bool mine = static_cast<int64_t>(i) >= owned.first && static_cast<int64_t>(i) < owned.second;
        if (mine && std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
            return ::testing::AssertionFailure() << what << "[" << i << "] = " << got[i] << " in the rank's block, "
                                                 << want[i] << " under ZeRO-1";
        if (!mine && !std::isnan(got[i]))
            return ::testing::AssertionFailure() << what << "[" << i << "] = " << got[i] << " outside the rank's block "
                                                 << "[" << owned.first << ", " << owned.second << "): not NaN";
    }
    return ::testing::AssertionSuccess();
}

}  // namespace

// ZeRO-3 changes where the weights live, not the arithmetic: after 4 steps of 2 micro-batches per rank
// (clipped, with weight decay) every rank's block of the weights and both moments, every loss, norm
// and evaluation have ZeRO-1's bits, everything outside the block is NaN between steps, and the
// checkpoint and HF export (gathered to rank 0) are ZeRO-1's files byte for byte.
TEST(CpuModelZero3, EqualsZeroOneBitForBitWhileEachRankHoldsOnlyItsBlock) {
    ModelOptions fp8 = CpuModel::fp32_options(kB, kT);
    fp8.matmul_dtype = DType::E4M3;
    fp8.gradient_dtype = DType::E5M2;
    struct Case {
        const char* name;
        bool tied;
        ModelOptions options;
    };
    for (const Case& k : {Case{"untied", false, CpuModel::fp32_options(kB, kT)},
                          Case{"tied", true, CpuModel::fp32_options(kB, kT)}, Case{"untied FP8", false, fp8}})
        for (int world : {2, 3}) {
            SCOPED_TRACE(std::string(k.name) + ", world " + std::to_string(world));
            const ModelConfig cfg = zero3_config(k.tied);
            test::TempDir dir;
            const std::vector<Trajectory> z1 = parallel(cfg, world, 1, k.options, dir / "z1"),
                                          z3 = parallel(cfg, world, 3, k.options, dir / "z3");
            const int64_t P = static_cast<int64_t>(z1[0].params.size());
            for (int r = 0; r < world; ++r) {
                SCOPED_TRACE("rank " + std::to_string(r));
                EXPECT_TRUE(same_bits(z3[r].losses, z1[0].losses));
                EXPECT_TRUE(same_bits(z3[r].norms, z1[0].norms));
                // the blocks tile [0, P) in rank order
                EXPECT_EQ(z3[r].owned.first, r == 0 ? 0 : z3[r - 1].owned.second);
                EXPECT_GT(z3[r].owned.second, z3[r].owned.first);
                EXPECT_TRUE(holds_only_block(z3[r].params, z1[0].params, z3[r].owned, "weights"));
                EXPECT_TRUE(holds_only_block(z3[r].adam_m, z1[0].adam_m, z3[r].owned, "Adam m"));
                EXPECT_TRUE(holds_only_block(z3[r].adam_v, z1[0].adam_v, z3[r].owned, "Adam v"));
                EXPECT_EQ(std::memcmp(&z3[r].eval, &z1[0].eval, sizeof(float)), 0) << z3[r].eval << " vs " << z1[0].eval;
                EXPECT_TRUE(std::isfinite(z3[r].eval));
                EXPECT_EQ(z3[r].eval_ignored, 0.0f) << "no target: no loss";
            }
            EXPECT_EQ(z3[world - 1].owned.second, P);
            for (const char* file : {"ckpt/model.safetensors", "ckpt/optimizer.safetensors", "hf/model.safetensors",
                                     "hf/config.json"})
                EXPECT_EQ(test::read_file(dir / (std::string("z3/") + file)), test::read_file(dir / (std::string("z1/") + file)))
                    << file;
        }
}

namespace {

// Passes every collective on to `inner`, except that the `drop`-th broadcast this rank receives
// (root another rank) lands in scratch: that part of a gather never arrives. `received` counts them.
class LosingCommunicator : public comm::Communicator {
public:
    LosingCommunicator(comm::Communicator& inner, int drop) : inner_(inner), drop_(drop) {}
    int rank() const override { return inner_.rank(); }
    int world() const override { return inner_.world(); }
    std::string backend() const override { return "losing " + inner_.backend(); }
    int received = 0;

protected:
    void do_all_reduce(const void* s, void* r, std::size_t n, DType t, void*) override { inner_.all_reduce(s, r, n, t); }
    void do_reduce_scatter(const void* s, void* r, std::size_t n, DType t, void*) override {
        inner_.reduce_scatter(s, r, n, t);
    }
    void do_reduce(const void* s, void* r, std::size_t n, DType t, int root, void*) override {
        inner_.reduce(s, r, n, t, root);
    }
    void do_all_gather(const void* s, void* r, std::size_t n, DType t, void*) override { inner_.all_gather(s, r, n, t); }
    void do_broadcast(void* b, std::size_t n, DType t, int root, void*) override {
        if (root != rank() && received++ == drop_) {
            std::vector<std::byte> scratch(n * dtype_size(t));
            inner_.broadcast(scratch.data(), n, t, root);
            return;
        }
        inner_.broadcast(b, n, t, root);
    }
    void do_barrier() override { inner_.barrier(); }

private:
    comm::Communicator& inner_;
    const int drop_;
};

struct LossyRun {
    int received_in_step = 0, received = 0;  // by rank 1: in forward_backward, and in all
    StepStats stats[2];
    float eval[2] = {0, 0};
};

// Two ZeRO-3 ranks: one micro-batch each and the step, then one evaluation; rank 1 loses its
// `drop`-th received broadcast (-1: none).
LossyRun lossy_run(const ModelConfig& cfg, int drop) {
    LossyRun out;
    comm::run_ranks(2, [&](comm::Communicator& c) {
        LosingCommunicator lossy(c, c.rank() == 1 ? drop : -1);
        CpuModel m(cfg, CpuModel::fp32_options(kB, kT));
        m.init_random(3);
        m.set_communicator(&lossy, 3);
        m.forward_backward(micro_batch(1, c.rank(), cfg.vocab_size).view(), 0.5f);
        if (c.rank() == 1) out.received_in_step = lossy.received;
        out.stats[c.rank()] = m.optimizer_step(params_for(1));
        out.eval[c.rank()] = m.evaluate(micro_batch(99, c.rank(), cfg.vocab_size).view());
        if (c.rank() == 1) out.received = lossy.received;
    });
    return out;
}

}  // namespace

// The NaN outside a rank's block is what makes ZeRO-3's protocol checkable: lose any one of the
// broadcasts a rank receives — in the forward, in the backward's second gather, in an evaluation —
// and the step (on every rank: the stats are global) or that rank's evaluation is NaN, never a
// plausible number computed from stale weights.
TEST(CpuModelZero3, AGatherThatDoesNotArriveShowsAsNaN) {
    for (bool tied : {false, true}) {
        SCOPED_TRACE(tied ? "tied" : "untied");
        const ModelConfig cfg = zero3_config(tied);
        const LossyRun honest = lossy_run(cfg, -1);
        ASSERT_GT(honest.received_in_step, 0);
        ASSERT_GT(honest.received, honest.received_in_step);
        for (int r = 0; r < 2; ++r) {
            EXPECT_TRUE(IModel::update_allowed(honest.stats[r]));
            EXPECT_TRUE(std::isfinite(honest.eval[r]));
        }
        for (int drop = 0; drop < honest.received; ++drop) {
            SCOPED_TRACE("broadcast " + std::to_string(drop) + " of " + std::to_string(honest.received) + " lost");
            const LossyRun lost = lossy_run(cfg, drop);
            if (drop < honest.received_in_step) {
                EXPECT_FALSE(IModel::update_allowed(lost.stats[0])) << lost.stats[0].loss << " " << lost.stats[0].grad_norm;
                EXPECT_FALSE(IModel::update_allowed(lost.stats[1]));
            } else {
                EXPECT_TRUE(IModel::update_allowed(lost.stats[1]));
                EXPECT_TRUE(std::isnan(lost.eval[1])) << lost.eval[1];
                EXPECT_EQ(std::memcmp(&lost.eval[0], &honest.eval[0], sizeof(float)), 0);
            }
        }
    }
}

// set_communicator away from ZeRO-3 gathers the whole state (weights and both moments) back to every
// rank: 2 steps at ZeRO-3 then 2 at ZeRO-1 are 4 steps at ZeRO-1, bit for bit.
TEST(CpuModelZero3, LeavingZeroThreeGathersTheWholeStateBack) {
    const ModelConfig cfg = zero3_config(false);
    const std::vector<Trajectory> z1 = parallel(cfg, 2, 1);
    comm::run_ranks(2, [&](comm::Communicator& c) {
        CpuModel m(cfg, CpuModel::fp32_options(kB, kT));
        m.init_random(3);
        m.set_communicator(&c, 3);
        std::vector<float> losses;
        for (int step = 1; step <= kSteps; ++step) {
            if (step == kSteps / 2 + 1) m.set_communicator(&c, 1);
            for (int j = 0; j < kA; ++j)
                m.forward_backward(micro_batch(step, j * 2 + c.rank(), cfg.vocab_size).view(), 1.0f / (kA * 2));
            losses.push_back(m.optimizer_step(params_for(step)).loss);
        }
        EXPECT_TRUE(same_bits(losses, z1[0].losses)) << "rank " << c.rank();
        EXPECT_TRUE(same_bits(all_params(m), z1[0].params)) << "rank " << c.rank();
        EXPECT_TRUE(same_bits(all_of(m, State::M), z1[0].adam_m)) << "rank " << c.rank();
        EXPECT_TRUE(same_bits(all_of(m, State::V), z1[0].adam_v)) << "rank " << c.rank();
    });
}
