// Data parallel on the GPU model (CudaModel::set_communicator, ZeRO-1/2), tested on one GPU: N ranks
// are N threads whose models share device 0 and talk through the copy-engine communicator (the
// design's --memcpy-all-gather path, which needs no second GPU).
//  - ZeRO-1 and ZeRO-2 give the same bits (losses, norms, every weight) at one micro-batch per step
//    (ZeRO-2 reduces each micro-batch's layer gradients as they come, so with more micro-batches the
//    additions come in another order: then both are compared with one rank), and every rank ends
//    with the same weights;
//  - N ranks equal one plain model with N x the micro-batches (same data in the same global order)
//    to rounding: fp32 tightly, bf16 and FP8 (with recompute and CUDA graphs) within bf16 noise;
//  - the sharded path over a one-rank communicator gives the plain path's bits;
//  - a block checkpoint written by every rank resumes bit-identically;
//  - ZeRO-3 (each rank keeps its block of the weights and gathers each layer from the owners) gives
//    ZeRO-2's bits at any number of micro-batches, and so ZeRO-1's at one, in bf16, FP8 (the
//    matrices gathered as FP8 codes with FP8 gradients, with and without persistent quants and
//    recompute; bf16 gathered and quantised in the slot without) and with the block streamed from
//    host memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/cuda/copy_engine_communicator.h"
#ifdef QTRAIN_HAVE_NCCL
#include "comm/cuda/nccl_communicator.h"
#endif
#include "comm/thread_world.h"
#include "gpu_model_fixture.h"
#include "gpu_ranks_util.h"
#include "model/cuda/param_shard.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

#ifdef QTRAIN_HAVE_NCCL
constexpr bool kNcclBuilt = true;
#else
constexpr bool kNcclBuilt = false;
#endif

ModelConfig dp_config() {
    ModelConfig c = small_config({"dp", 384, 128, 256, 3, 2, 1, false});
    c.rope_theta = 50000.0;
    c.rms_norm_eps = 1e-5;
    c.validate("test");
    return c;
}

constexpr int kB = 2, kT = 64;

// Micro-batch k of step `step` in the global order: rank r of W takes k = j * W + r.
Tokens tokens(int vocab, int step, int k) {
    const uint64_t seed = 7919u * static_cast<uint64_t>(step) + static_cast<uint64_t>(k) + 1;
    return random_tokens(kB, kT, vocab, seed, Masked::None);
}

struct DpRun {
    std::vector<float> losses, norms;
    std::vector<std::vector<float>> weights;  // per rank: every tensor's model-dtype weights, concatenated
};

OptimizerParams params(int step) { return {2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step}; }

// Steps [first, last] on rank `rank` of `world` with `micro` micro-batches per rank (`reversed`: in
// the opposite order, which changes only the order the gradients are summed in).
void train_steps(CudaModel& m, int first, int last, int rank, int world, int micro, DpRun* run,
                 bool reversed = false) {
    for (int step = first; step <= last; ++step) {
        for (int i = 0; i < micro; ++i) {
            const int j = reversed ? micro - 1 - i : i;
            Tokens d = tokens(m.config().vocab_size, step, j * world + rank);
            m.forward_backward(Batch{d.in.data(), d.tgt.data(), kB, kT}, 1.0f / static_cast<float>(micro * world));
        }
        const StepStats s = m.optimizer_step(params(step));
        if (rank == 0 && run) {
            run->losses.push_back(s.loss);
            run->norms.push_back(s.grad_norm);
        }
    }
}

enum class Backend { CopyEngine, Nccl };

// Runs fn(rank, communicator) on `world` threads (all on device 0; NCCL: world 1 only, it cannot put
// two ranks on one GPU); rethrows the first failure.
void run_gpu_ranks(int world, const std::function<void(int, comm::Communicator&)>& fn,
                   Backend backend = Backend::CopyEngine) {
#ifdef QTRAIN_HAVE_NCCL
    std::unique_ptr<comm::NcclThreadsWorld> nccl;
    if (backend == Backend::Nccl) nccl = std::make_unique<comm::NcclThreadsWorld>(std::vector<int>{0});
#endif
    QT_CHECK(backend == Backend::CopyEngine || kNcclBuilt, "this build has no NCCL");
    run_rank_threads(
        world,
        [&](int r, comm::ThreadWorld& tw) -> std::unique_ptr<comm::Communicator> {
#ifdef QTRAIN_HAVE_NCCL
            if (nccl) return comm::make_nccl_communicator(*nccl, r);
#endif
            return comm::make_copy_engine_communicator(tw, r, 0);
        },
        fn);
}

// `world` ranks (ZeRO `zero`; world 0: the plain one-GPU path, -1: the same with each step's
// micro-batches in reverse order) training `steps` steps of `micro` micro-batches per rank from the
// same initial weights.
DpRun run(const ModelOptions& base, int world, int zero, int steps, int micro, Backend backend = Backend::CopyEngine) {
    const ModelConfig cfg = dp_config();
    DpRun out;
    if (world <= 0) {
        ModelOptions o = base;
        CudaModel m(cfg, o);
        m.init_random(42);
        train_steps(m, 1, steps, 0, 1, micro, &out, world < 0);
        out.weights.push_back(all_weights(m));
        return out;
    }
    out.weights.resize(world);
    run_gpu_ranks(world, [&](int r, comm::Communicator& c) {
        ModelOptions o = base;
        o.gpus = world;
        // ZeRO-2's plan: one block of the gradient (unless CUDA graphs; on one rank there is nothing to
        // shard); ZeRO-3's: and one block of the weights
        o.shard_gradients = zero >= 2 && world > 1;
        o.shard_weights = zero == 3 && world > 1;
        CudaModel m(cfg, o);
        m.set_communicator(&c, zero);
        m.init_random(42);
        train_steps(m, 1, steps, r, world, micro, &out);
        out.weights[r] = all_weights(m);
    }, backend);
    return out;
}

// The smallest per-tensor weight cosine of two runs of dp_config (gpu_ranks_util.h: the k_proj biases
// are left out, their cosine reported in *k_bias).
double worst_cosine(const std::vector<float>& a, const std::vector<float>& b, std::string* where,
                    double* k_bias = nullptr) {
    return worst_weight_cosine(make_gpu_layout(dp_config()), a, b, where, k_bias);
}

struct Mode {
    const char* name;
    void (*apply)(ModelOptions&);
    double loss_rel;    // allowed relative loss difference from one rank with N x the micro-batches
    double min_cosine;  // allowed smallest per-tensor weight cosine after the steps
};

const Mode kModes[] = {
    {"fp32", [](ModelOptions& o) { o.model_dtype = o.matmul_dtype = o.gradient_dtype = DType::F32; }, 1e-5, 0.999999},
    {"bf16", [](ModelOptions&) {}, 2e-3, 0.9999},
    {"e4m3, e5m2 gradients, recompute, CUDA graphs",
     [](ModelOptions& o) {
         o.matmul_dtype = DType::E4M3;
         o.gradient_dtype = DType::E5M2;
         o.recompute_block = true;
         o.use_cuda_graphs = true;
     },
     // FP8 turns the last-bit differences of a reordered fp32 sum into whole FP8 steps: 0.99888 on the
     // H200, where one rank with its micro-batches reversed is further still from the plain order
     // (0.99834, printed beside it)
     5e-3, 0.998},
    {"bf16 moments, offloaded double-buffered optimizer",
     [](ModelOptions& o) {
         o.opt_m_dtype = o.opt_v_dtype = DType::BF16;
         o.offload_master = o.offload_opt_m = o.offload_opt_v = o.offload_double_buffer = true;
         o.optimizer_chunk = 4096;
     },
     2e-3, 0.9999},
    {"bf16 master", [](ModelOptions& o) { o.master_dtype = o.opt_m_dtype = o.opt_v_dtype = DType::BF16; }, 2e-3,
     0.9999},
    // --lm-head-dtype=e4m3: every rank quantises the (gathered) head after each update; the bounds of
    // the FP8 mode above (written before a GPU run of this mode)
    {"e4m3 with an FP8 LM head, e5m2 gradients, recompute, CUDA graphs",
     [](ModelOptions& o) {
         o.matmul_dtype = DType::E4M3;
         o.gradient_dtype = DType::E5M2;
         o.fp8_lm_head = true;
         o.recompute_block = true;
         o.use_cuda_graphs = true;
     },
     5e-3, 0.998},
};

ModelOptions base_options() {
    ModelOptions o;
    o.batch_size = kB;
    o.seq_len = kT;
    return o;
}

}  // namespace

class DataParallel : public ::testing::TestWithParam<int> {};

TEST_P(DataParallel, TwoRanksOnOneGpuEqualOneRankWithTwiceTheMicroBatches) {
    QTRAIN_REQUIRE_GPU();
    const Mode& mode = kModes[GetParam()];
    ModelOptions o = base_options();
    mode.apply(o);
    constexpr int kSteps = 10, kMicro = 2;
    const DpRun one = run(o, 0, 1, kSteps, 2 * kMicro);
    const DpRun z1 = run(o, 2, 1, kSteps, kMicro);
    const DpRun z2 = run(o, 2, 2, kSteps, kMicro);
    {  // one micro-batch per rank: ZeRO-1 and ZeRO-2 sum the same elements once, so the same bits
        const DpRun a = run(o, 2, 1, kSteps, 1), b = run(o, 2, 2, kSteps, 1);
        EXPECT_TRUE(same_bits(a.losses, b.losses)) << mode.name;
        EXPECT_TRUE(same_bits(a.norms, b.norms)) << mode.name;
        EXPECT_TRUE(same_bits(a.weights[0], b.weights[0])) << mode.name;
        EXPECT_LT(a.losses.back(), a.losses.front()) << mode.name;
    }
    EXPECT_TRUE(same_bits(z1.weights[0], z1.weights[1])) << mode.name << ": the ranks' weights differ";
    EXPECT_TRUE(same_bits(z2.weights[0], z2.weights[1])) << mode.name << ": the ranks' weights differ";
    // against one rank: rounding only (the micro-batch gradients are added in another order)
    // the rounding noise of a reordered sum: one rank with its micro-batches in reverse order
    const DpRun reordered = run(o, -1, 1, kSteps, 2 * kMicro);
    std::string floor_where;
    const double floor = worst_cosine(reordered.weights[0], one.weights[0], &floor_where);
    double worst_loss = 0;
    for (int s = 0; s < kSteps; ++s) {
        worst_loss = std::max(worst_loss, std::abs(double(z1.losses[s]) - one.losses[s]) / std::abs(one.losses[s]));
        EXPECT_NEAR(z1.norms[s], one.norms[s], 1e-2 * one.norms[s] + 1e-6) << mode.name << " step " << s;
    }
    for (int s = 0; s < kSteps; ++s) {
        worst_loss = std::max(worst_loss, std::abs(double(z2.losses[s]) - one.losses[s]) / std::abs(one.losses[s]));
        EXPECT_NEAR(z2.norms[s], one.norms[s], 1e-2 * one.norms[s] + 1e-6) << mode.name << " ZeRO-2 step " << s;
    }
    std::string where, where2;
    double k_bias = 0;
    const double cos = worst_cosine(z1.weights[0], one.weights[0], &where, &k_bias);
    const double cos2 = worst_cosine(z2.weights[0], one.weights[0], &where2);
    std::printf("[dp %s] ZeRO-2 (per-layer reductions unless CUDA graphs) vs 1 rank: worst weight cosine %.7f (%s)\n",
                mode.name, cos2, where2.c_str());
    EXPECT_GE(cos2, mode.min_cosine) << mode.name << " ZeRO-2 (" << where2 << ")";
    std::printf("[dp %s] 2 ranks vs 1: worst loss rel diff %.2e (loss %.5f -> %.5f), worst weight cosine %.7f (%s; "
                "k_proj biases: %.4f); one rank with its micro-batches reversed: %.7f (%s)\n",
                mode.name, worst_loss, one.losses.front(), one.losses.back(), cos, where.c_str(), k_bias, floor,
                floor_where.c_str());
    EXPECT_LE(worst_loss, mode.loss_rel) << mode.name;
    EXPECT_GE(cos, mode.min_cosine) << mode.name << " (" << where << ")";
    // the run learnt something (a test of equal no-ops would pass too)
    EXPECT_LT(one.losses.back(), one.losses.front() - 0.05f) << mode.name;
}

INSTANTIATE_TEST_SUITE_P(Modes, DataParallel, ::testing::Range(0, static_cast<int>(std::size(kModes))),
                         [](const ::testing::TestParamInfo<int>& i) { return "mode" + std::to_string(i.param); });

TEST(DataParallelGpu, ThreeRanksEqualOneRank) {
    QTRAIN_REQUIRE_GPU();
    ModelOptions o = base_options();
    const DpRun one = run(o, 0, 1, 4, 3);
    const DpRun three = run(o, 3, 2, 4, 1);
    for (int r = 1; r < 3; ++r) EXPECT_TRUE(same_bits(three.weights[0], three.weights[r])) << "rank " << r;
    for (int s = 0; s < 4; ++s) EXPECT_NEAR(three.losses[s], one.losses[s], 2e-3 * one.losses[s]) << "step " << s;
    std::string where;
    EXPECT_GE(worst_cosine(three.weights[0], one.weights[0], &where), 0.9999) << where;
}

TEST(DataParallelGpu, OneRankCommunicatorGivesThePlainPathsBits) {
    QTRAIN_REQUIRE_GPU();
    std::vector<std::pair<Backend, const char*>> backends = {{Backend::CopyEngine, "copy-engine"}};
#ifdef QTRAIN_HAVE_NCCL
    backends.push_back({Backend::Nccl, "nccl"});
#endif
    for (auto [backend, name] : backends)
        for (bool fp8 : {false, true}) {
            SCOPED_TRACE(std::string(name) + (fp8 ? " e4m3" : " bf16"));
            ModelOptions o = base_options();
            if (fp8) o.matmul_dtype = DType::E4M3;
            const DpRun plain = run(o, 0, 1, 4, 2);
            const DpRun sharded = run(o, 1, 2, 4, 2, backend);
            EXPECT_TRUE(same_bits(plain.losses, sharded.losses));
            EXPECT_TRUE(same_bits(plain.norms, sharded.norms));
            EXPECT_TRUE(same_bits(plain.weights[0], sharded.weights[0]));
        }
}

TEST(DataParallelGpu, BlockCheckpointResumesBitIdentically) {
    QTRAIN_REQUIRE_GPU();
    TempDir tmp;
    const std::string dir = (tmp.path / "ckpt").string();
    std::filesystem::create_directories(dir);
    const ModelConfig cfg = dp_config();
    ModelOptions o = base_options();
    o.gpus = 2;
    o.shard_gradients = true;
    o.opt_m_dtype = DType::BF16;  // the moments are stored as they are
    DpRun whole, resumed;
    whole.weights.resize(2);
    resumed.weights.resize(2);
    run_gpu_ranks(2, [&](int r, comm::Communicator& c) {
        CudaModel m(cfg, o);
        m.set_communicator(&c, 2);
        m.init_random(3);
        train_steps(m, 1, 3, r, 2, 2, nullptr);
        m.save_checkpoint(dir);
        train_steps(m, 4, 6, r, 2, 2, &whole);
        whole.weights[r] = all_weights(m);
    });
    for (int r = 0; r < 2; ++r) EXPECT_TRUE(std::filesystem::exists(dir + "/block-0000" + std::to_string(r) + "-of-00002.safetensors"));
    run_gpu_ranks(2, [&](int r, comm::Communicator& c) {
        CudaModel m(cfg, o);
        m.set_communicator(&c, 2);
        m.load_checkpoint(dir);
        train_steps(m, 4, 6, r, 2, 2, &resumed);
        resumed.weights[r] = all_weights(m);
    });
    EXPECT_TRUE(same_bits(whole.losses, resumed.losses));
    EXPECT_TRUE(same_bits(whole.norms, resumed.norms));
    for (int r = 0; r < 2; ++r) EXPECT_TRUE(same_bits(whole.weights[r], resumed.weights[r])) << "rank " << r;
    // at other world sizes: reshard_test.cpp
}

TEST(DataParallelGpu, PlanCountsOneBlockOfTheOptimizerState) {
    const ModelConfig cfg = dp_config();
    ModelOptions o = base_options();
    const MemoryPlan one = CudaModel::plan(cfg, o);
    o.gpus = 4;
    const MemoryPlan four = CudaModel::plan(cfg, o);
    auto bytes = [](const MemoryPlan& p, const std::string& category) {
        for (const auto& e : p.entries)
            if (e.category == category) return e.device_bytes;
        return uint64_t{0};
    };
    for (const char* c : {"Adam M", "Adam V", "Master"}) {
        EXPECT_LT(bytes(four, c), bytes(one, c) / 3) << c;
        EXPECT_GT(bytes(four, c), bytes(one, c) / 5) << c;
    }
    EXPECT_GE(bytes(four, "Weights"), bytes(one, "Weights"));
    EXPECT_GE(bytes(four, "Gradients"), bytes(one, "Gradients"));  // ZeRO-1: whole
    // ZeRO-2: one block, plus two layer slots, the reduction's span and the non-layer gradients (for
    // this 3-layer toy those outweigh the saving; for 0.5B on 4 ranks it is ~0.8 GB less)
    o.shard_gradients = true;
    const MemoryPlan zero2 = CudaModel::plan(cfg, o);
    EXPECT_LT(bytes(zero2, "Gradients"), bytes(one, "Gradients") / 3);
    EXPECT_GT(bytes(zero2, "Gradient slots"), 0u);
    ModelOptions big = base_options();
    big.gpus = 4;
    const ModelConfig half = preset_config("Qwen2.5-0.5B");
    const MemoryPlan big1 = CudaModel::plan(half, big);
    big.shard_gradients = true;
    const MemoryPlan big2 = CudaModel::plan(half, big);
    EXPECT_LT(big2.total_device() + (700ull << 20), big1.total_device());
}

// ZeRO-2 with --offload-gradients: each rank's block of the gradient in pinned host memory (the
// reductions still run on the device slots), zero-copy or staged by the double-buffered optimizer:
// the same bits as ZeRO-1 on the device at one micro-batch per rank.
TEST(DataParallelGpu, OffloadedGradientBlocksGiveZeroOnesBits) {
    QTRAIN_REQUIRE_GPU();
    ModelOptions o = base_options();
    const DpRun device = run(o, 2, 1, 6, 1);
    for (bool staged : {false, true}) {
        SCOPED_TRACE(staged ? "double-buffered" : "zero-copy");
        ModelOptions off = o;
        off.offload_gradients = true;
        off.offload_double_buffer = staged;
        off.optimizer_chunk = 4096;
        const DpRun host = run(off, 2, 2, 6, 1);
        EXPECT_TRUE(same_bits(device.losses, host.losses));
        EXPECT_TRUE(same_bits(device.norms, host.norms));
        EXPECT_TRUE(same_bits(device.weights[0], host.weights[0]));
    }
    ModelOptions zero1 = o;
    zero1.gpus = 2;
    zero1.offload_gradients = true;
    EXPECT_ERROR(CudaModel::plan(dp_config(), zero1), "needs ZeRO-2");
}

// ZeRO-2 with bf16 gradient blocks (--param-grad-dtype=bf16): each micro-batch's sum over the ranks
// is added into the block with stochastic rounding. Against one rank with fp32 gradients (H200: loss
// within 1.0e-4, worst weight cosine 0.99981, device and offloaded blocks alike): bounds with a few
// times that margin, looser than fp32 blocks' 0.9999 (the bf16 sums round each micro-batch's addition).
TEST(DataParallelGpu, Bf16GradientBlocksStayCloseToOneRank) {
    QTRAIN_REQUIRE_GPU();
    ModelOptions o = base_options();
    const DpRun one = run(o, 0, 1, 10, 4);
    for (bool offload : {false, true}) {
        ModelOptions b = o;
        b.param_grad_dtype = DType::BF16;
        b.offload_gradients = offload;
        const DpRun two = run(b, 2, 2, 10, 2);
        std::string where;
        const double cos = worst_cosine(two.weights[0], one.weights[0], &where);
        double worst = 0;
        for (int s = 0; s < 10; ++s)
            worst = std::max(worst, std::abs(double(two.losses[s]) - one.losses[s]) / one.losses[s]);
        std::printf("[dp bf16 gradient blocks%s] vs 1 rank fp32: worst loss rel diff %.2e, worst weight cosine %.7f "
                    "(%s)\n", offload ? ", offloaded" : "", worst, cos, where.c_str());
        EXPECT_LE(worst, 1e-3);
        EXPECT_GE(cos, 0.9995) << where;
        EXPECT_TRUE(same_bits(two.weights[0], two.weights[1]));
    }
}

// ZeRO-3 on one GPU (two and three ranks through the copy-engine communicator): the layers a rank
// computes with are gathered from the owners' blocks, which hold the bytes ZeRO-2's whole copies
// hold, and the gradients take ZeRO-2's per-layer path: so the same bits as ZeRO-2 (losses, norms,
// every weight, on every rank) with two micro-batches per rank, and as ZeRO-1 with one.
TEST(DataParallelGpu, ZeroThreeGivesZeroTwosBits) {
    QTRAIN_REQUIRE_GPU();
    struct Case {
        const char* name;
        void (*apply)(ModelOptions&);
        int world;
    };
    const Case cases[] = {
        {"bf16", [](ModelOptions&) {}, 2},
        {"bf16, 3 ranks", [](ModelOptions&) {}, 3},
        {"e4m3 with e4m3 gradients, persistent quants, recompute",
         [](ModelOptions& o) {
             o.matmul_dtype = o.gradient_dtype = DType::E4M3;
             o.persistent_quants = true;
             o.recompute_block = true;
         },
         2},
        {"e4m3 with e5m2 gradients (FP8 codes gathered every pass)", [](ModelOptions& o) {
             o.matmul_dtype = DType::E4M3;
             o.gradient_dtype = DType::E5M2;
         }, 3},
        {"e4m3 with bf16 gradients (bf16 gathered, quantised in the slot)",
         [](ModelOptions& o) { o.matmul_dtype = DType::E4M3; }, 2},
        {"e4m3, quants in host memory", [](ModelOptions& o) {
             o.matmul_dtype = o.gradient_dtype = DType::E4M3;
             o.offload_quants = true;
         }, 3},
        {"block streamed from host memory (--offload-master), offloaded double-buffered optimizer",
         [](ModelOptions& o) {
             o.offload_master = o.offload_opt_m = o.offload_opt_v = o.offload_double_buffer = true;
             o.optimizer_chunk = 4096;
         },
         2},
        {"bf16 master", [](ModelOptions& o) { o.master_dtype = o.opt_m_dtype = o.opt_v_dtype = DType::BF16; }, 2},
        // --lm-head-dtype=e4m3: ZeRO-3 keeps the head resident on every rank (broadcast by changed()) and
        // quantises it there into its own buffers; ZeRO-2 into the flat FP8 copies: the same codes
        {"e4m3 with an FP8 LM head, e5m2 gradients", [](ModelOptions& o) {
             o.matmul_dtype = DType::E4M3;
             o.gradient_dtype = DType::E5M2;
             o.fp8_lm_head = true;
         }, 2},
        {"e4m3 with an FP8 LM head, bf16 gradients", [](ModelOptions& o) {
             o.matmul_dtype = DType::E4M3;
             o.fp8_lm_head = true;
         }, 3},
        {"everything in host memory: the block, master, moments, gradient blocks and FP8 quants",
         [](ModelOptions& o) {
             o.matmul_dtype = o.gradient_dtype = DType::E4M3;
             o.offload_master = o.offload_opt_m = o.offload_opt_v = o.offload_gradients = true;
             o.offload_quants = o.write_combined = true;
             o.recompute_block = true;
         },
         2},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.name);
        ModelOptions o = base_options();
        c.apply(o);
        // (--offload-quants places the quants of streamed layers: without ZeRO-3 there are none, and
        // the flag is refused)
        ModelOptions o2 = o;
        o2.offload_quants = false;
        const DpRun z2 = run(o2, c.world, 2, 10, 2), z3 = run(o, c.world, 3, 10, 2);
        EXPECT_TRUE(same_bits(z2.losses, z3.losses));
        EXPECT_TRUE(same_bits(z2.norms, z3.norms));
        for (int r = 0; r < c.world; ++r) EXPECT_TRUE(same_bits(z2.weights[0], z3.weights[r])) << "rank " << r;
        EXPECT_LT(z3.losses.back(), z3.losses.front() - 0.05f);  // it learnt something
        // (ZeRO-1 refuses host gradients: its gradient stays on the device, as OffloadedGradientBlocks
        // compares)
        ModelOptions o1 = o2;
        o1.offload_gradients = false;
        const DpRun z1 = run(o1, c.world, 1, 3, 1), z3one = run(o, c.world, 3, 3, 1);
        EXPECT_TRUE(same_bits(z1.losses, z3one.losses));
        EXPECT_TRUE(same_bits(z1.weights[0], z3one.weights[0]));
    }
}

// ZeRO-3's plan: one block of the weights (the non-layer weights whole, two layer slots), and
// --plan-only names ZeRO-3 among the flags that fit a budget on several GPUs.
TEST(DataParallelGpu, PlanCountsOneBlockOfTheWeightsUnderZeroThree) {
    const ModelConfig half = preset_config("Qwen2.5-0.5B");
    ModelOptions o = base_options();
    o.gpus = 4;
    o.shard_gradients = true;
    const MemoryPlan z2 = CudaModel::plan(half, o);
    o.shard_weights = true;
    const MemoryPlan z3 = CudaModel::plan(half, o);
    auto bytes = [](const MemoryPlan& p, const std::string& category) {
        for (const auto& e : p.entries)
            if (e.category == category) return e.device_bytes;
        return uint64_t{0};
    };
    const GpuParamLayout layout = make_gpu_layout(half);
    const ParamShard block = param_shard(layout.total, 4, 0);
    EXPECT_GE(bytes(z3, "Weights"), static_cast<uint64_t>(block.size) * 2);
    EXPECT_LT(bytes(z3, "Weights"), static_cast<uint64_t>(block.size) * 2 + (1u << 20));
    EXPECT_GT(bytes(z3, "Weight slots"), 0u);
    // the other ranks' blocks are saved (3/4 of the bf16 weights: ~740 MB), less the whole non-layer
    // copy (the tied embedding: 272 MB) and two layer slots; nothing else changes
    const int64_t layers = layout.layers_end() - layout.layer_begin(0), non_layer = layout.total - layers;
    const double saved = 2.0 * double(block.padded_total() - block.size - non_layer - 2 * layout.layer_span);
    EXPECT_GT(saved, 350e6);
    EXPECT_NEAR(double(z2.total_device()) - double(z3.total_device()), saved, double(1 << 20));
    ModelOptions bad = base_options();
    bad.gpus = 2;
    bad.shard_weights = true;  // without the gradients' per-layer path
    EXPECT_ERROR(CudaModel::plan(half, bad), "--zero-level=3");
}

// A micro-batch without a valid target on one rank (all targets ignored, e.g. a fully masked SFT
// sample): ZeRO-2's per-layer reductions and ZeRO-3's gathers are collectives inside the backward,
// so that rank must still run it (adding zeros) or the others would wait for it forever. The same
// bits as ZeRO-1, where the rank simply contributes nothing.
TEST(DataParallelGpu, AMicroBatchWithoutTargetsOnOneRankStillJoinsTheCollectives) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = dp_config();
    auto train = [&](int zero) {
        DpRun out;
        out.weights.resize(2);
        run_gpu_ranks(2, [&](int r, comm::Communicator& c) {
            ModelOptions o = base_options();
            o.gpus = 2;
            o.shard_gradients = zero >= 2;
            o.shard_weights = zero == 3;
            CudaModel m(cfg, o);
            m.set_communicator(&c, zero);
            m.init_random(42);
            for (int step = 1; step <= 4; ++step) {
                Tokens d = tokens(cfg.vocab_size, step, r);
                if (r == 1 && step == 2) std::fill(d.tgt.begin(), d.tgt.end(), -1);
                m.forward_backward(Batch{d.in.data(), d.tgt.data(), kB, kT}, 0.5f);
                const StepStats s = m.optimizer_step(params(step));
                if (r == 0) out.losses.push_back(s.loss), out.norms.push_back(s.grad_norm);
                if (step == 2) {  // and an evaluation where rank 1's batch has no target
                    Tokens e = tokens(cfg.vocab_size, 100, r);
                    if (r == 1) std::fill(e.tgt.begin(), e.tgt.end(), -1);
                    const float loss = m.evaluate(Batch{e.in.data(), e.tgt.data(), kB, kT});
                    if (r == 1) EXPECT_EQ(loss, 0.0f);
                }
            }
            out.weights[r] = all_weights(m);
        });
        return out;
    };
    const DpRun z1 = train(1), z2 = train(2), z3 = train(3);
    EXPECT_TRUE(same_bits(z1.losses, z2.losses));
    EXPECT_TRUE(same_bits(z1.losses, z3.losses));
    EXPECT_TRUE(same_bits(z1.norms, z3.norms));
    EXPECT_TRUE(same_bits(z1.weights[0], z2.weights[0]));
    EXPECT_TRUE(same_bits(z1.weights[0], z3.weights[1]));
}
