// The GPU model's training step on one GPU with and without the data-parallel (sharded) path: the
// plain path, the sharded path over a one-rank NCCL communicator and over a one-rank copy-engine
// communicator (the same arithmetic; the difference is the collectives' overhead, issue 18's "within
// 1%" target). Random tokens, from-scratch weights, bf16 moments (bench_qtrain.sh's settings).
//   dp_step_bench MODEL BATCH [e4m3] [steps=12]
// Prints one line per path: median ms per step (forward, backward and optimizer step; the optimizer
// step waits for the GPU) and tokens/s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "comm/cuda/copy_engine_communicator.h"
#include "comm/thread_world.h"
#include "core/rng.h"
#include "model/cuda/cuda_model.h"
#include "model/model_config.h"
#include "train/option_table.h"
#ifdef QTRAIN_HAVE_NCCL
#include "comm/cuda/nccl_communicator.h"
#endif

using namespace qtrain;

namespace {

constexpr int kSeq = 1024;

double median_step_ms(const ModelConfig& cfg, const ModelOptions& opt, comm::Communicator* c, int steps) {
    CudaModel m(cfg, opt);
    if (c) m.set_communicator(c, 1);
    m.init_random(1);
    const int N = opt.batch_size * kSeq;
    std::vector<int32_t> in(N), tgt(N);
    Rng rng(7);
    std::vector<double> ms;
    for (int s = 0; s < steps; ++s) {
        for (int i = 0; i < N; ++i) in[i] = static_cast<int32_t>(rng.below(cfg.vocab_size)), tgt[i] = static_cast<int32_t>(rng.below(cfg.vocab_size));
        const auto t0 = std::chrono::steady_clock::now();
        m.forward_backward(Batch{in.data(), tgt.data(), opt.batch_size, kSeq}, 1.0f);
        m.optimizer_step({3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, s + 1});
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    ms.erase(ms.begin(), ms.begin() + std::min<int>(3, steps - 1));  // warm-up (GEMM choices, first touches)
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    (void)qtrain::train_option_table();  // the flag names the models' messages print (model/flag_names.h)
    try {
        const std::string model = argc > 1 ? argv[1] : "Qwen2.5-0.5B";
        const int batch = argc > 2 ? std::atoi(argv[2]) : 16;
        const bool fp8 = argc > 3 && std::string(argv[3]) == "e4m3";
        const int steps = argc > 4 ? std::atoi(argv[4]) : 12;
        const ModelConfig cfg = preset_config(model);
        ModelOptions o;
        o.batch_size = batch;
        o.seq_len = kSeq;
        o.opt_m_dtype = o.opt_v_dtype = DType::BF16;
        if (fp8) {
            o.matmul_dtype = DType::E4M3;
            o.gradient_dtype = DType::E5M2;
        }
        auto report = [&](const char* path, double ms) {
            std::printf("%-28s %s b%d%s: %8.2f ms/step  %8.0f tokens/s\n", path, model.c_str(), batch,
                        fp8 ? " e4m3" : " bf16", ms, batch * kSeq / (ms / 1000.0));
            std::fflush(stdout);
        };
        for (int round = 0; round < 2; ++round) {  // twice: the order of the paths is not what differs
            report("plain", median_step_ms(cfg, o, nullptr, steps));
#ifdef QTRAIN_HAVE_NCCL
            {
                comm::NcclThreadsWorld world({0});
                auto c = comm::make_nccl_communicator(world, 0);
                report("sharded, NCCL world 1", median_step_ms(cfg, o, c.get(), steps));
            }
#endif
            comm::ThreadWorld tw(1);
            auto c = comm::make_copy_engine_communicator(tw, 0, 0);
            report("sharded, copy-engine world 1", median_step_ms(cfg, o, c.get(), steps));
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dp_step_bench: %s\n", e.what());
        return 1;
    }
}
