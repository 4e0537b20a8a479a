// Training throughput of the CPU reference model at the demo's size (Qwen2.5's real 151936-token
// vocabulary, a 4-layer 128-wide body). Disabled by default (it takes tens of seconds); run with
//   qtrain_model_tests --gtest_also_run_disabled_tests --gtest_filter='*Throughput*'
// QTRAIN_BENCH_STEPS and QTRAIN_BENCH_LMHEAD_CHUNKS override the defaults.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "cpu_test_util.h"
#include "model/cpu/cpu_model.h"

namespace qtrain {
namespace {

int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) : fallback;
}

TEST(CpuModelBench, DISABLED_DemoThroughput) {
    ModelConfig cfg;
    cfg.vocab_size = 151936;
    cfg.hidden_size = 128;
    cfg.num_hidden_layers = 4;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.head_dim = 32;
    cfg.intermediate_size = 512;
    cfg.tie_word_embeddings = true;
    const int B = 8, T = 128, steps = env_int("QTRAIN_BENCH_STEPS", 3);
    ModelOptions opt = CpuModel::fp32_options(B, T);
    opt.lmhead_chunks = env_int("QTRAIN_BENCH_LMHEAD_CHUNKS", 8);
    CpuModel model(cfg, opt);
    model.init_random(1);
    OptimizerParams o;
    o.learning_rate = 1e-3f;
    o.weight_decay = 0.1f;
    o.grad_clip = 1.0f;
    using clock = std::chrono::steady_clock;
    double total = 0.0, fb_total = 0.0, cpu_total = 0.0;
    for (int step = 0; step <= steps; ++step) {  // step 0 warms up (allocation, page faults)
        const test::TokenBatch tb = test::random_batch(B, T, cfg.vocab_size, step);
        const auto t0 = clock::now();
        const std::clock_t c0 = std::clock();
        model.forward_backward(tb.view(), 1.0f);
        const auto t1 = clock::now();
        o.step = step + 1;
        const StepStats s = model.optimizer_step(o);
        const auto t2 = clock::now();
        const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;  // all threads
        const double fb = std::chrono::duration<double>(t1 - t0).count();
        const double all = std::chrono::duration<double>(t2 - t0).count();
        std::printf(
            "step %d: loss %.4f norm %.4f | forward+backward %.3f s, optimizer %.3f s, cpu time %.3f s | "
            "%.0f tokens/s\n",
            step, s.loss, s.grad_norm, fb, all - fb, cpu, B * T / all);
        if (step > 0) total += all, fb_total += fb, cpu_total += cpu;
    }
    std::printf(
        "demo model (%lld parameters), batch %d x %d, lmhead_chunks %d: %.0f tokens/s "
        "(forward+backward %.3f s, step total %.3f s, cpu time %.3f s per step)\n",
        static_cast<long long>(cfg.num_parameters()), B, T, opt.lmhead_chunks, B * T * steps / total, fb_total / steps,
        total / steps, cpu_total / steps);
}

}  // namespace
}  // namespace qtrain
