// LoRA on the CPU reference model in data parallel (issue 33, cpu_data_parallel.cpp): W ranks as
// threads, each with A micro-batches, against one model with W x A micro-batches of the same data in
// the global order (rank r trains micro-batch j * W + r): each step's summed adapter gradient, loss
// and norm, and the adapters and their moments after several clipped AdamW steps agree to fp32
// rounding (only the order of the micro-batch additions differs; the tolerances of
// cpu_model_data_parallel_test), every rank holds the same bits, and with dropout > 0 each rank
// draws the masks of the global micro-batches it trains. A checkpoint of W ranks (written once)
// resumes bit for bit at W and continues the one-rank run at another number of ranks. ZeRO-2 and 3
// (the adapters' gradient reduce-scattered to the blocks' owners) give ZeRO-1's bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/run_ranks.h"
#include "core/error.h"
#include "core/rng.h"
#include "cpu_test_util.h"
#include "model/cpu/cpu_model.h"
#include "test_util.h"

namespace qtrain {
namespace {

namespace fs = std::filesystem;

constexpr int kB = 2, kT = 12, kA = 2, kSteps = 4;

struct Case {
    const char* name;
    ModelConfig (*config)(bool);
    float dropout;
    const char* targets;
    const char* train_also;
    bool fp8 = false;  // the FP8 base (--matmul-dtype=e4m3, e5m2 gradients: the CPU emulation)
};

const Case kCases[] = {
    {"qwen2", test::tiny_config, 0.0f, "all", ""},
    {"qwen2_dropout", test::tiny_config, 0.3f, "all", ""},
    {"llama_dropout_subset", test::tiny_llama_config, 0.2f, "q,v,gate,down", ""},
    {"qwen3", test::tiny_qwen3_config, 0.0f, "k,o,up", ""},
    {"qwen2_dropout_train_also", test::tiny_config, 0.1f, "all", "norms,embeddings"},
    {"qwen2_dropout_fp8_base", test::tiny_config, 0.2f, "all", "", true},
};

ModelOptions options(const Case& c) {
    ModelOptions o = CpuModel::fp32_options(kB, kT);
    o.lmhead_chunks = 2;
    o.lora.rank = 3;
    o.lora.alpha = 6.0f;
    o.lora.dropout = c.dropout;
    o.lora.targets = parse_lora_targets(c.targets, "--lora-targets");
    o.lora.train_also = parse_lora_train_also(c.train_also, "--train-also");
    o.lora.seed = 99;
    if (c.fp8) {
        o.matmul_dtype = DType::E4M3;
        o.gradient_dtype = DType::E5M2;
    }
    return o;
}

OptimizerParams params_for(int step) {
    OptimizerParams o;
    o.learning_rate = 1e-2f;
    o.weight_decay = 0.1f;
    o.grad_clip = 0.05f;  // below the norms: clipping is exercised
    // epsilon 1e-2 as in cuda_lora_test: the update a smooth function of the gradient, so the fp32
    // rounding of the summation order is not blown up to +-lr on the elements whose gradient is ~0
    o.epsilon = 1e-2f;
    o.step = step;
    return o;
}

test::TokenBatch micro_batch(int step, int k, int vocab) { return test::random_batch(kB, kT, vocab, 1000 * step + k, 5); }

// The same start on every model: the base from a seed, B of every adapter non-zero (A: the seed's).
void start(CpuModel& m) {
    m.init_random(3);
    Rng rng(17);
    for (const ParamSpec& s : m.lora().specs()) {
        if (s.name.find(".lora_B.") == std::string::npos) continue;
        float* v = m.lora().param(s.name);
        for (int64_t i = 0; i < s.numel(); ++i) v[i] = 0.05f * rng.normal();
    }
}

std::vector<float> gathered(CpuModel& m, std::vector<float>& (CpuLora::*which)()) {
    std::vector<float> out;
    for (const ParamSpec& s : m.lora().specs()) {
        const int64_t o = m.lora().offsets()[&s - m.lora().specs().data()];
        const std::vector<float>& all = (m.lora().*which)();
        out.insert(out.end(), all.begin() + o, all.begin() + o + s.numel());
    }
    return out;
}
// (the --train-also tensors' values live in the base: read them through param())
std::vector<float> values(CpuModel& m) {
    std::vector<float> out;
    for (const ParamSpec& s : m.lora().specs()) {
        const float* p = m.param(s.name);
        out.insert(out.end(), p, p + s.numel());
    }
    return out;
}

struct Trajectory {
    std::vector<float> losses, norms;
    std::vector<std::vector<float>> grads;  // per step, before the update (a rank's own, unsummed)
    std::vector<float> values, m, v;
    uint64_t passes = 0;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// max |a - b| <= rtol * max |ref|
::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& ref, double rtol,
                                 const std::string& what) {
    if (got.size() != ref.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
    double max_ref = 0, max_d = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        max_ref = std::max(max_ref, std::abs(double(ref[i])));
        max_d = std::max(max_d, std::abs(double(got[i]) - ref[i]));
    }
    if (max_ref > 0 && max_d <= rtol * max_ref) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << what << ": max difference " << max_d << " against max " << max_ref;
}

// Steps [first, last] of rank `rank` of `world` (one model: world 1 with W x A micro-batches).
void train(CpuModel& m, int first, int last, int rank, int world, int micro, Trajectory& run) {
    for (int step = first; step <= last; ++step) {
        for (int j = 0; j < micro; ++j)
            m.forward_backward(micro_batch(step, j * world + rank, m.config().vocab_size).view(),
                               1.0f / static_cast<float>(micro * world));
        run.grads.push_back(gathered(m, &CpuLora::grads));
        const StepStats s = m.optimizer_step(params_for(step));
        run.losses.push_back(s.loss);
        run.norms.push_back(s.grad_norm);
    }
    run.values = values(m);
    run.m = gathered(m, &CpuLora::moments_m);
    run.v = gathered(m, &CpuLora::moments_v);
    run.passes = m.lora().passes();
}

Trajectory single(const Case& c, int micro) {
    CpuModel m(c.config(false), options(c));
    start(m);
    Trajectory run;
    train(m, 1, kSteps, 0, 1, micro, run);
    return run;
}

std::vector<Trajectory> parallel(const Case& c, int world, int zero_level = 1) {
    std::vector<Trajectory> runs(world);
    comm::run_ranks(world, [&](comm::Communicator& comm) {
        CpuModel m(c.config(false), options(c));
        m.set_communicator(&comm, zero_level);
        start(m);
        train(m, 1, kSteps, comm.rank(), world, kA, runs[comm.rank()]);
    });
    return runs;
}

}  // namespace

TEST(CpuLoraDataParallel, RanksEqualOneModelOnTheSameGlobalBatch) {
    for (const Case& c : kCases)
        for (int world : {2, 3}) {
            SCOPED_TRACE(std::string(c.name) + " world " + std::to_string(world));
            const Trajectory ref = single(c, kA * world);
            const std::vector<Trajectory> runs = parallel(c, world);
            for (int r = 1; r < world; ++r) {
                EXPECT_TRUE(same_bits(runs[r].values, runs[0].values)) << "rank " << r << " holds other adapters";
                EXPECT_TRUE(same_bits(runs[r].m, runs[0].m)) << "rank " << r << " holds other moments";
                EXPECT_EQ(runs[r].losses, runs[0].losses);
                EXPECT_EQ(runs[r].norms, runs[0].norms);
            }
            for (int s = 0; s < kSteps; ++s) {
                SCOPED_TRACE("step " + std::to_string(s + 1));
                EXPECT_NEAR(runs[0].losses[s], ref.losses[s], 1e-6 * std::abs(ref.losses[s]));
                EXPECT_NEAR(runs[0].norms[s], ref.norms[s], 1e-6 * std::abs(ref.norms[s]));
                EXPECT_GT(ref.norms[s], params_for(s + 1).grad_clip) << "clipping must be exercised";
                // the ranks' own gradients summed in rank order = the one model's gradient of the step
                std::vector<float> sum(ref.grads[s].size(), 0.0f);
                for (const Trajectory& r : runs)
                    for (size_t i = 0; i < sum.size(); ++i) sum[i] += r.grads[s][i];
                EXPECT_TRUE(close(sum, ref.grads[s], 1e-5, "summed adapter gradient"));
                EXPECT_FALSE(same_bits(runs[0].grads[s], ref.grads[s])) << "rank 0 saw the whole batch?";
            }
            EXPECT_TRUE(close(runs[0].values, ref.values, 1e-5, "adapters after the steps"));
            EXPECT_TRUE(close(runs[0].m, ref.m, 1e-5, "Adam m"));
            EXPECT_TRUE(close(runs[0].v, ref.v, 1e-5, "Adam v"));
            // the pass count is the global one (what a checkpoint records)
            EXPECT_EQ(runs[0].passes, ref.passes);
            EXPECT_EQ(ref.passes, static_cast<uint64_t>(kSteps * kA * world));
        }
}

// With dropout the masks decide the numbers: W ranks that all drew the masks of their local pass
// (the count without the rank's offset) would not equal one model. So the test above can fail on the
// masks: here the gradient of a dropout run is shown to differ from the same run's without dropout
// by far more than the tolerance the test above compares gradients with.
TEST(CpuLoraDataParallel, DropoutChangesTheGradientBeyondTheTolerance) {
    const Trajectory a = single(kCases[1], kA * 2), b = single(kCases[0], kA * 2);
    EXPECT_FALSE(close(a.grads[0], b.grads[0], 1e-3, "gradient with dropout against without"));
}

// ZeRO-2 and ZeRO-3 of the adapters (cpu_data_parallel.cpp): the blocks' gradients reduce-scattered
// instead of all-reduced, the same norm and block updates: the bits of ZeRO-1 on every rank, every
// step, with dropout, --train-also and the FP8 base. The options the train command gives a ZeRO-2/3
// run are accepted.
TEST(CpuLoraDataParallel, ZeroTwoAndThreeGiveZeroOnesBits) {
    for (const Case& c : kCases)
        for (int world : {2, 3}) {
            const std::vector<Trajectory> one = parallel(c, world, 1);
            for (int level : {2, 3}) {
                SCOPED_TRACE(std::string(c.name) + " world " + std::to_string(world) + " ZeRO-" + std::to_string(level));
                const std::vector<Trajectory> runs = parallel(c, world, level);
                for (int r = 0; r < world; ++r) {
                    EXPECT_TRUE(same_bits(runs[r].values, one[r].values)) << "rank " << r;
                    EXPECT_TRUE(same_bits(runs[r].m, one[r].m)) << "rank " << r;
                    EXPECT_TRUE(same_bits(runs[r].v, one[r].v)) << "rank " << r;
                    EXPECT_EQ(runs[r].losses, one[r].losses);
                    EXPECT_EQ(runs[r].norms, one[r].norms);
                }
            }
        }
    ModelOptions o = options(kCases[0]);
    o.gpus = 2;
    o.shard_gradients = true;
    EXPECT_NO_THROW(CpuModel(test::tiny_config(false), o));
    o.shard_weights = true;
    EXPECT_NO_THROW(CpuModel(test::tiny_config(false), o));
}

// The ZeRO-3 run above must differ from a wrong one: the adapters after a step with a learning rate
// changed in its last bits differ, so same_bits can fail.
TEST(CpuLoraDataParallel, SameBitsCanFail) {
    const std::vector<Trajectory> a = parallel(kCases[4], 2, 3);
    std::vector<Trajectory> b(2);
    comm::run_ranks(2, [&](comm::Communicator& comm) {
        CpuModel m(kCases[4].config(false), options(kCases[4]));
        m.set_communicator(&comm, 3);
        start(m);
        for (int j = 0; j < kA; ++j)
            m.forward_backward(micro_batch(1, j * 2 + comm.rank(), m.config().vocab_size).view(), 1.0f / (2 * kA));
        OptimizerParams p = params_for(1);
        p.learning_rate = std::nextafter(p.learning_rate, 1.0f);
        m.optimizer_step(p);
        train(m, 2, kSteps, comm.rank(), 2, kA, b[comm.rank()]);
    });
    EXPECT_FALSE(same_bits(a[0].values, b[0].values));
}

// A checkpoint written at ZeRO-2 or 3 (the whole adapter state, rank 0's files) continues bit for bit
// at the level and world it was written at, at ZeRO-1, and at another number of ranks continues the
// one-model run to fp32 rounding (the test below).
TEST(CpuLoraDataParallel, CheckpointOfZeroTwoAndThreeResumesAtAnyLevel) {
    const Case& c = kCases[4];  // dropout and --train-also
    for (int level : {2, 3}) {
        SCOPED_TRACE("written at ZeRO-" + std::to_string(level));
        test::TempDir tmp;
        const std::string dir = tmp / "ckpt";
        const std::vector<Trajectory> whole = parallel(c, 2, level);
        comm::run_ranks(2, [&](comm::Communicator& comm) {
            CpuModel p(c.config(false), options(c));
            p.set_communicator(&comm, level);
            start(p);
            Trajectory first;
            train(p, 1, 2, comm.rank(), 2, kA, first);
            if (comm.rank() == 0) fs::create_directories(dir);
            comm.barrier();
            p.save_checkpoint(dir);
            comm.barrier();
        });
        for (int resume_level : {1, 2, 3}) {
            SCOPED_TRACE("resumed at ZeRO-" + std::to_string(resume_level));
            std::vector<Trajectory> resumed(2);
            comm::run_ranks(2, [&](comm::Communicator& comm) {
                CpuModel q(c.config(false), options(c));
                q.set_communicator(&comm, resume_level);
                q.init_random(3);
                q.load_checkpoint(dir);
                train(q, 3, kSteps, comm.rank(), 2, kA, resumed[comm.rank()]);
            });
            for (int r = 0; r < 2; ++r) {
                EXPECT_TRUE(same_bits(resumed[r].values, whole[r].values)) << "rank " << r;
                EXPECT_TRUE(same_bits(resumed[r].m, whole[r].m)) << "rank " << r;
                EXPECT_TRUE(same_bits(resumed[r].v, whole[r].v)) << "rank " << r;
                EXPECT_EQ(std::vector<float>(whole[r].losses.begin() + 2, whole[r].losses.end()), resumed[r].losses);
            }
        }
    }
}

// A checkpoint of 2 ranks after 2 steps (the adapters and their moments, written by rank 0 once, with
// the global pass count): resumed by 2 ranks it continues bit for bit; resumed by one model with the
// same micro-batches per step (or 4 ranks with one each) it continues the one-model run to fp32
// rounding, dropout masks included.
TEST(CpuLoraDataParallel, CheckpointResumesBitExactlyAndAtAnotherNumberOfRanks) {
    const Case& c = kCases[1];  // dropout 0.3
    test::TempDir tmp;
    const std::string dir = tmp / "ckpt";
    std::vector<Trajectory> whole(2), first(2), resumed(2);
    comm::run_ranks(2, [&](comm::Communicator& comm) {
        const int r = comm.rank();
        CpuModel m(c.config(false), options(c));
        m.set_communicator(&comm, 1);
        start(m);
        train(m, 1, kSteps, r, 2, kA, whole[r]);
        CpuModel p(c.config(false), options(c));
        p.set_communicator(&comm, 1);
        start(p);
        train(p, 1, 2, r, 2, kA, first[r]);
        if (r == 0) fs::create_directories(dir);
        comm.barrier();
        p.save_checkpoint(dir);
        comm.barrier();
        CpuModel q(c.config(false), options(c));
        q.set_communicator(&comm, 1);
        q.init_random(3);  // the base as at the start (the engine loads it from --model), then the adapters
        q.load_checkpoint(dir);
        train(q, 3, kSteps, r, 2, kA, resumed[r]);
    });
    EXPECT_TRUE(fs::exists(fs::path(dir) / "adapter_model.safetensors"));
    for (int r = 0; r < 2; ++r) {
        EXPECT_TRUE(same_bits(resumed[r].values, whole[r].values)) << "rank " << r;
        EXPECT_TRUE(same_bits(resumed[r].m, whole[r].m)) << "rank " << r;
        EXPECT_TRUE(same_bits(resumed[r].v, whole[r].v)) << "rank " << r;
        EXPECT_EQ(std::vector<float>(whole[r].losses.begin() + 2, whole[r].losses.end()), resumed[r].losses);
    }
    // one model with 4 micro-batches per step from the same checkpoint, against the uninterrupted one model
    const Trajectory ref = single(c, 2 * kA);
    for (int world : {1, 4}) {
        SCOPED_TRACE("resumed at world " + std::to_string(world));
        std::vector<Trajectory> other(world);
        comm::run_ranks(world, [&](comm::Communicator& comm) {
            CpuModel m(c.config(false), options(c));
            if (world > 1) m.set_communicator(&comm, 1);
            m.init_random(3);
            m.load_checkpoint(dir);
            train(m, 3, kSteps, comm.rank(), world, 2 * kA / world, other[comm.rank()]);
        });
        for (int s = 0; s < 2; ++s)
            EXPECT_NEAR(other[0].losses[s], ref.losses[2 + s], 1e-6 * std::abs(ref.losses[2 + s])) << "step " << 3 + s;
        EXPECT_TRUE(close(other[0].values, ref.values, 1e-5, "adapters"));
        EXPECT_EQ(other[0].passes, ref.passes);
    }
}

}  // namespace qtrain
