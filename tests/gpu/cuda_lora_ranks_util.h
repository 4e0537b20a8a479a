// What the LoRA data-parallel GPU tests (cuda_lora_data_parallel_test.cpp: ZeRO-1/2 of the adapters;
// cuda_lora_zero3_test.cpp: ZeRO-3 of the frozen base) share: the modes they train, W ranks as threads
// on one GPU (gpu_ranks_util.h) each with A micro-batches of the global order (rank r trains
// micro-batch j * W + r), or one plain model with W x A of them, and every adapter's state gathered
// after the steps.
#pragma once

#include <string>
#include <vector>

#include "comm/cuda/copy_engine_communicator.h"
#include "comm/thread_world.h"
#include "cuda_lora_fixture.h"
#include "gpu_model_fixture.h"
#include "gpu_ranks_util.h"
#include "model/lora.h"

namespace qtrain::test::lora_ranks {

inline constexpr int kB = 2, kT = 48, kSteps = 5;

struct Mode {
    const char* name;
    ModelConfig (*config)();
    DType act;
    float dropout;
    bool graphs;        // recompute + CUDA graphs
    double loss_rel;    // data_parallel_test's bounds for the dtype
    double min_cosine;  // smallest per-tensor adapter cosine after the steps
    uint32_t train_also = 0;  // --train-also: their gradients all-reduced with the adapters'
    bool recompute = false;   // --recompute-block without CUDA graphs (ZeRO-3 refuses graphs)
    int rank = 8;             // the adapters' rank and alpha (lora_options' 8 and 16 unless set)
    float alpha = 16.0f;
};

inline const Mode kModes[] = {
    {"qwen2 fp32", qwen2_case, DType::F32, 0.0f, false, 1e-5, 0.999999},
    {"qwen2 fp32 dropout", qwen2_case, DType::F32, 0.2f, false, 1e-5, 0.999999},
    {"llama fp32 dropout", llama_case, DType::F32, 0.3f, false, 1e-5, 0.999999},
    {"qwen3 bf16 dropout", qwen3_case, DType::BF16, 0.2f, false, 2e-3, 0.9999},
    {"qwen2 bf16 dropout, recompute, CUDA graphs", qwen2_case, DType::BF16, 0.2f, true, 2e-3, 0.9999},
    {"qwen2 fp32 train-also norms,embeddings", qwen2_case, DType::F32, 0.0f, false, 1e-5, 0.999999,
     kTrainNorms | kTrainEmbeddings},
    {"qwen3 (tied) bf16 dropout, recompute, CUDA graphs, train-also norms,embeddings", qwen3_case, DType::BF16, 0.2f,
     true, 2e-3, 0.9999, kTrainNorms | kTrainEmbeddings},
    // an untied head trained on the bf16 base: at ZeRO-3 the embedding and the head are separate non-layer
    // tensors, each written into its owners' blocks and broadcast by changed() (cuda_lora_zero3_test.cpp)
    {"qwen2 (untied) bf16, train-also norms,embeddings", qwen2_case, DType::BF16, 0.0f, false, 2e-3, 0.9999,
     kTrainNorms | kTrainEmbeddings},
};

inline ModelOptions options(const Mode& m) {
    // (lora_gpu_options and lora_options: cuda_lora_fixture.h)
    LoraOptions lora = lora_options(m.dropout, "all", m.train_also);
    lora.rank = m.rank;
    lora.alpha = m.alpha;
    ModelOptions o = lora_gpu_options(m.act, kB, kT, lora);
    o.recompute_block = m.graphs || m.recompute;
    o.use_cuda_graphs = m.graphs;
    return o;
}

// epsilon 1e-2 as in cuda_lora_test: the update a smooth function of the gradient
inline OptimizerParams params(int step) { return {1e-2f, 0.9f, 0.95f, 1e-2f, 0.1f, 1.0f, step}; }

inline Tokens tokens(int vocab, int step, int k) {
    return random_tokens(kB, kT, vocab, 7919u * static_cast<uint64_t>(step) + static_cast<uint64_t>(k) + 1,
                         Masked::Every11thFrom3);
}

// The same start everywhere: the base from the seed, B of every adapter non-zero (A: the seed's).
inline void start(CudaModel& m) { start_lora_models({&m}, 42, 3); }

struct LoraRun {
    std::vector<float> losses, norms;
    std::vector<float> initial;                // the adapters before the steps
    std::vector<std::vector<float>> adapters;  // per rank: every adapter's master, concatenated
    std::vector<std::vector<float>> moments;   // per rank: Adam's m and v
};

// Every adapter's master or moment, concatenated (the host mirror's order): the whole state, every
// rank's block gathered into the mirror (collective with several ranks: every rank calls it alike).
inline std::vector<float> adapters(CudaModel& m, CudaModel::Which which) {
    m.lora()->download_to_host();
    CpuLora& h = m.lora()->host();
    const std::vector<float>& all = which == CudaModel::Which::Master  ? h.params()
                                    : which == CudaModel::Which::AdamM ? h.moments_m()
                                                                       : h.moments_v();
    std::vector<float> out;
    for (std::size_t i = 0; i < h.specs().size(); ++i)
        out.insert(out.end(), all.begin() + h.offsets()[i], all.begin() + h.offsets()[i] + h.specs()[i].numel());
    return out;
}

inline void train(CudaModel& m, int first, int last, int rank, int world, int micro, LoraRun* run) {
    for (int step = first; step <= last; ++step) {
        for (int j = 0; j < micro; ++j) {
            const Tokens d = tokens(m.config().vocab_size, step, j * world + rank);
            m.forward_backward(d.batch(kB, kT), 1.0f / static_cast<float>(micro * world));
        }
        const StepStats s = m.optimizer_step(params(step));
        if (run && rank == 0) {
            run->losses.push_back(s.loss);
            run->norms.push_back(s.grad_norm);
        }
    }
}

inline void keep_state(CudaModel& m, int rank, LoraRun& run) {
    run.adapters[rank] = adapters(m, CudaModel::Which::Master);
    std::vector<float> mv = adapters(m, CudaModel::Which::AdamM), v = adapters(m, CudaModel::Which::AdamV);
    mv.insert(mv.end(), v.begin(), v.end());
    run.moments[rank] = mv;
}

// One rank's options of a `world`-rank run at `zero_level` (what the train command sets: ZeRO-2 and 3
// shard the adapters' gradient, ZeRO-3 the frozen base), on the FP8 base (e4m3 with e5m2 gradients)
// when `fp8_base`.
inline ModelOptions rank_options(const Mode& mode, int world, int zero_level, bool fp8_base) {
    ModelOptions o = options(mode);
    o.gpus = world;
    o.shard_gradients = zero_level >= 2;
    o.shard_weights = zero_level == 3;
    if (fp8_base) o.matmul_dtype = DType::E4M3, o.gradient_dtype = DType::E5M2;
    return o;
}

// world 0: the plain one-GPU model with `micro` micro-batches per step. `fp8_base`: the FP8 e4m3 base
// with e5m2 gradients (bf16 modes only). zero_level 3: ZeRO-3 of the frozen base (bf16 modes without
// CUDA graphs).
inline LoraRun run(const Mode& mode, int world, int micro, int zero_level = 1, bool fp8_base = false) {
    const ModelConfig cfg = mode.config();
    LoraRun out;
    if (world == 0) {
        out.adapters.resize(1);
        out.moments.resize(1);
        CudaModel m(cfg, options(mode));
        start(m);
        out.initial = adapters(m, CudaModel::Which::Master);
        train(m, 1, kSteps, 0, 1, micro, &out);
        keep_state(m, 0, out);
        return out;
    }
    out.adapters.resize(world);
    out.moments.resize(world);
    run_rank_threads(
        world, [](int r, comm::ThreadWorld& tw) { return comm::make_copy_engine_communicator(tw, r, 0); },
        [&](int r, comm::Communicator& c) {
            CudaModel m(cfg, rank_options(mode, world, zero_level, fp8_base));
            m.set_communicator(&c, zero_level);
            start(m);
            train(m, 1, kSteps, r, world, micro, &out);
            keep_state(m, r, out);
        });
    return out;
}

// Two ranks through a checkpoint: steps 1-2 with `save_o` at `save_level`, a checkpoint into `dir`
// (collective), steps 3..kSteps into `whole`; then new models with `load_o` at `load_level`, the base
// from the seed (as the engine loads it from --model before the checkpoint), the checkpoint, steps
// 3..kSteps into `resumed`. `passes`: each rank's LoRA pass count right after the load.
struct ResumeRuns {
    LoraRun whole, resumed;
    std::vector<uint64_t> passes;
};

inline ResumeRuns checkpoint_and_resume(const ModelConfig& cfg, const ModelOptions& save_o, int save_level,
                                        const ModelOptions& load_o, int load_level, const std::string& dir) {
    ResumeRuns out;
    for (LoraRun* r : {&out.whole, &out.resumed}) r->adapters.resize(2), r->moments.resize(2);
    out.passes.resize(2);
    run_rank_threads(
        2, [](int r, comm::ThreadWorld& tw) { return comm::make_copy_engine_communicator(tw, r, 0); },
        [&](int r, comm::Communicator& c) {
            {
                CudaModel m(cfg, save_o);
                m.set_communicator(&c, save_level);
                start(m);
                train(m, 1, 2, r, 2, 2, nullptr);
                m.save_checkpoint(dir);
                c.barrier();
                train(m, 3, kSteps, r, 2, 2, &out.whole);
                keep_state(m, r, out.whole);
            }
            CudaModel m(cfg, load_o);
            m.set_communicator(&c, load_level);
            m.init_random(42);
            m.load_checkpoint(dir);
            out.passes[r] = m.lora()->host().passes();
            train(m, 3, kSteps, r, 2, 2, &out.resumed);
            keep_state(m, r, out.resumed);
        });
    return out;
}

}  // namespace qtrain::test::lora_ranks
