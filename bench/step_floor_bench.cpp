// The measured floor of one training command's GEMMs and attention on this GPU (issue 32's per-op
// accounting): takes `train`'s own flags, lists the micro-batch's GEMMs as the GPU model runs them
// (model/cuda/step_gemms.h: each matrix's forward, recompute, dx and dW, the LM head by chunks, in the
// dtypes, fast accumulation and beta the flags give) and times each shape alone with the model's own
// GemmRunner, twice: cuBLASLt's first heuristic choice (what a run without --gemm-autotune uses) and the
// fastest of its candidates (--gemm-autotune's choice, once decided); the floor ("ms/mb", "best") takes the
// faster of the two. Then the attention forward and
// backward at the micro-batch's shape with the backend the model would choose (+ the forward again
// when the recompute re-runs it), and the device-to-device copy rate (the floor of the elementwise
// ops), the PCIe rate, and the memory-bound ops' floors: their bytes (model/cuda/step_traffic.h) at
// those rates, under the op timer's names (`QTRAIN_TIME_BREAKDOWN=1` times them in the step). LoRA's
// adapters are GEMMs of the list too (model/cuda/step_gemms.h's lora_step_gemms: "lora gemm"). Not here:
// the recompute's elementwise ops, host copies of streamed weights, gradients and residuals.
//
// usage: step_floor_bench TRAIN_FLAGS...   e.g.
//   step_floor_bench --model=Qwen2.5-7B --from-scratch --batch-size=4 --seq-len=1024 --model-dtype=bf16 \
//       --lmhead-chunks=2 --attn-bwd-chunks=2
// (the flags of bench/bench_qtrain.sh's command; --train-file is not needed). One line per GEMM shape,
// totals per micro-batch, and a last line of JSON. Operands hold small constant values: only time counts.
// --list (first argument): print the GEMM list and its flop without timing anything (no GPU needed).
// --constant-operands (first argument): fill the operands with one byte value (sessions 21-25) instead of
// random values (see fill_random).
// --sustain=SECONDS (first argument): afterwards, run the micro-batch's GEMMs and attention in sequence,
// back to back, for that long, printing the time per micro-batch with the SM clock and power draw as it
// goes: the per-shape timings above last milliseconds each, a training step runs for minutes, and the
// H200 holds its power cap by lowering its clock (a floor taken in bursts can be one no step reaches).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_check.h"
#include "bench_random.h"
#include "gpu_clock.h"
#include "core/dtype.h"
#include "cuda/attention.h"
#include "cuda/fp8.h"
#include "cuda/gemm.h"
#include "model/cuda/attention_choice.h"
#include "model/cuda/gpu_buffers.h"
#include "model/cuda/step_gemms.h"
#include "model/cuda/step_traffic.h"
#include "model/model_config.h"
#include "train/model_source.h"
#include "train/train_options.h"

using namespace qtrain;

namespace {

// The operands' values: random by default. A GEMM's speed at a given clock does not depend on its
// values, but its power does (bits that toggle), and the H200 holds its 700 W cap by lowering the clock:
// session 26 measured the floor's constant operands (0x3c bytes) at 1,750-1,810 MHz and 465-520 W held
// for 20 s, while the training steps themselves (real values) ran at 1,470-1,520 MHz and ~690 W.
// --constant-operands gives sessions 21-25's fill back.
bool g_random_operands = true;

void* device_bytes(std::size_t n, bool operand = true) {
    void* p = nullptr;
    n = std::max<std::size_t>(n, 256);
    CK(cudaMalloc(&p, n));
    if (operand && g_random_operands) fill_random(p, n);
    else CK(cudaMemset(p, 0x3c, n));  // bf16 ~0.011, e4m3 1.5, e5m2 1.0, fp32 ~0.012
    return p;
}

// Milliseconds per call of f: `warm` untimed calls, then `reps` timed back to back on `s`.
template <class F>
double time_calls(F&& f, cudaStream_t s, int warm, int reps) {
    for (int i = 0; i < warm; ++i) f();
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < reps; ++i) f();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return ms / reps;
}

// --sustain: one micro-batch's GEMMs and attention queued back to back, again and again for `seconds`.
// Each micro-batch is bracketed by events; the next is queued before the previous one is waited for, so
// the clock and power are read while the GPU is busy. One line a second; the result is the mean of
// the second half (after the clock has settled under the power cap), beside `burst_ms` (the sum of the
// per-shape timings: what the floor above assumes).
struct Sustained {
    double ms = 0;  // per micro-batch, the mean over the second half
    int sm_mhz = -1;
    double watts = -1;
};

template <class F>
Sustained run_sustained(F&& micro_batch, cudaStream_t s, double seconds, double burst_ms) {
    bench::GpuClock clock;
    std::printf("sustained for %.0f s: the micro-batch's GEMMs and attention in sequence (burst sum %.2f ms)%s\n",
                seconds, burst_ms, clock.available() ? "" : "; NVML not found: no clock or power readings");
    std::printf("%8s %6s %12s %8s %8s\n", "t s", "mbs", "ms/mb", "SM MHz", "W");
    struct Mb {
        cudaEvent_t a, b;
    };
    auto queue = [&] {
        Mb m{};
        CK(cudaEventCreate(&m.a));
        CK(cudaEventCreate(&m.b));
        CK(cudaEventRecord(m.a, s));
        micro_batch();
        CK(cudaEventRecord(m.b, s));
        return m;
    };
    struct Sample {
        double t, ms;
        int mhz;
        double w;
    };
    std::vector<Sample> samples;
    const auto t0 = std::chrono::steady_clock::now();
    auto now_s = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    Mb cur = queue();
    double line_t = 0, line_ms = 0, line_w = 0;
    int line_n = 0, line_mhz = 0;
    for (;;) {
        const bool last = now_s() >= seconds;
        Mb next{};
        if (!last) next = queue();  // the GPU stays busy while `cur` is read
        CK(cudaEventSynchronize(cur.b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, cur.a, cur.b));
        CK(cudaEventDestroy(cur.a));
        CK(cudaEventDestroy(cur.b));
        const Sample x{now_s(), ms, clock.sm_mhz(), clock.watts()};
        samples.push_back(x);
        line_ms += x.ms, line_mhz += x.mhz, line_w += x.w, ++line_n;
        if (x.t - line_t >= 1.0 || last) {
            std::printf("%8.1f %6d %12.2f %8d %8.0f\n", x.t, line_n, line_ms / line_n, line_mhz / line_n,
                        line_w / line_n);
            line_t = x.t, line_ms = 0, line_w = 0, line_n = 0, line_mhz = 0;
        }
        if (last) break;
        cur = next;
    }
    Sustained r;
    const std::size_t from = samples.size() / 2;
    double mhz = 0, w = 0;
    for (std::size_t i = from; i < samples.size(); ++i) r.ms += samples[i].ms, mhz += samples[i].mhz, w += samples[i].w;
    const double n = static_cast<double>(samples.size() - from);
    r.ms /= n;
    r.sm_mhz = static_cast<int>(mhz / n);
    r.watts = w / n;
    std::printf("sustained: %.2f ms a micro-batch over the second half (%zu micro-batches), SM %d MHz, %.0f W; the "
                "first took %.2f ms; burst sum %.2f ms\n",
                r.ms, samples.size() - from, r.sm_mhz, r.watts, samples.front().ms, burst_ms);
    return r;
}

struct Operands {
    void *w, *act, *act2, *out, *bias;
    float* scale;
};

// One of LoRA's adapter GEMMs as LoraAdapters makes it (lora_adapters.cpp's gemm_fwd / gemm_bwd_input /
// gemm_bwd_weight: row strides and the slices' alignment from the list).
void run_lora_gemm(GemmRunner& r, const StepGemm& g, const Operands& p, cudaStream_t s) {
    const int64_t ld_in = g.ld_in ? g.ld_in : g.in, ld_out = g.ld_out ? g.ld_out : g.out;
    GemmOp op;
    op.a_type = op.b_type = op.c_type = g.dtype;
    op.beta = g.beta;
    op.min_alignment = g.min_alignment;
    switch (g.pass) {
        case GemmPass::Forward:
        case GemmPass::Recompute:  // y[N, out] (+)= x[N, in] w[out, in]^T
            op.trans_a = true;
            op.m = g.out, op.n = g.tokens, op.k = g.in;
            op.a = p.w, op.lda = g.in, op.b = p.act, op.ldb = ld_in, op.c = p.out, op.ldc = ld_out;
            break;
        case GemmPass::InputGrad:  // dx[N, in] (+)= dy[N, out] w[out, in]
            op.m = g.in, op.n = g.tokens, op.k = g.out;
            op.a = p.w, op.lda = g.in, op.b = p.act, op.ldb = ld_out, op.c = p.out, op.ldc = ld_in;
            break;
        case GemmPass::WeightGrad:  // dw[out, in] += dy^T x, fp32
            op.trans_b = true;
            op.m = g.in, op.n = g.out, op.k = g.tokens;
            op.a = p.act, op.lda = ld_in, op.b = p.act2, op.ldb = ld_out, op.c = p.out, op.ldc = g.in;
            op.c_type = DType::F32;
            break;
    }
    r.run(op, s);
}

// One call of g as CudaModel makes it (cuda_model_linear.cpp, cuda_model_step.cpp).
void run_gemm(GemmRunner& r, const StepGemm& g, const Operands& p, cudaStream_t s) {
    if (g.lora) return run_lora_gemm(r, g, p, s);
    const DType A = g.dtype;
    const void* bias = g.bias ? p.bias : nullptr;
    switch (g.pass) {
        case GemmPass::Forward:
        case GemmPass::Recompute:
            if (g.fp8)
                r.linear_forward_fp8(p.out, A, p.act, DType::E4M3, p.scale, p.w, DType::E4M3, p.scale, bias, g.tokens,
                                     g.in, g.out, s, g.beta, g.fast_accum);
            else
                r.linear_forward(p.out, A, p.act, p.w, A, bias, g.tokens, g.in, g.out, s, g.beta);
            return;
        case GemmPass::InputGrad:
            if (g.fp8)
                r.linear_backward_input_fp8(p.out, A, p.act, g.grad_dtype, p.scale, p.w, DType::E4M3, p.scale, g.tokens,
                                            g.in, g.out, s, g.beta, g.fast_accum);
            else
                r.linear_backward_input(p.out, A, p.act, p.w, A, g.tokens, g.in, g.out, s, g.beta);
            return;
        case GemmPass::WeightGrad:
            if (g.fp8)
                r.linear_backward_weight_fp8(p.out, DType::F32, p.act, g.grad_dtype, p.scale, p.act2, DType::E4M3,
                                             p.scale, g.tokens, g.in, g.out, g.beta != 0.0f, s, g.fast_accum);
            else
                r.linear_backward_weight(p.out, DType::F32, p.act, p.act2, A, g.tokens, g.in, g.out, g.beta != 0.0f, s);
            return;
    }
}

int run(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    bool list_only = false;
    double sustain_s = 0;
    while (!args.empty() && (args[0] == "--list" || args[0] == "--constant-operands" ||
                             args[0].rfind("--sustain=", 0) == 0)) {
        if (args[0] == "--list") {
            list_only = true;
        } else if (args[0] == "--constant-operands") {
            g_random_operands = false;
        } else {
            const std::string v = args[0].substr(10);
            std::size_t used = 0;
            try {
                sustain_s = std::stod(v, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            if (used != v.size() || !(sustain_s > 0 && sustain_s <= 600))
                throw std::runtime_error("--sustain=" + v + ": expected seconds in (0, 600]");
        }
        args.erase(args.begin());
    }
    const TrainOptions topt = train_options_from_args(args);
    const ModelConfig c = resolve_model_source(topt).config;
    const ModelOptions o = topt.model_options("cuda");
    const int B = o.batch_size, T = o.seq_len;
    const int64_t N = static_cast<int64_t>(B) * T;
    std::vector<StepGemm> gemms = step_gemms(c, o);
    for (StepGemm& g : lora_step_gemms(c, o)) gemms.push_back(std::move(g));  // (none without --lora-rank)
    if (list_only) {
        for (const StepGemm& g : gemms)
            std::printf("%-20s %6lld %6lld %6lld %5d %s%s%s\n", g.name.c_str(), static_cast<long long>(g.tokens),
                        static_cast<long long>(g.in), static_cast<long long>(g.out), g.calls,
                        g.fp8 ? "fp8" : std::string(dtype_name(g.dtype)).c_str(), g.fast_accum ? " fast" : "",
                        g.beta != 0.0f ? " beta1" : "");
        std::printf("%.4g flop per micro-batch of %lld tokens (%.4g a token)\n", total_flop(gemms),
                    static_cast<long long>(N), total_flop(gemms) / N);
        for (const StepTraffic& t : step_traffic(c, o))
            std::printf("%-34s device %.3f GB, PCIe %.3f GB%s\n", t.name.c_str(), t.device_bytes / 1e9,
                        t.host_bytes / 1e9, t.per_step ? " per optimizer step" : " per micro-batch");
        return 0;
    }

    std::size_t w_bytes = 0, act_bytes = 0, out_bytes = 0, bias_bytes = 0;
    for (const StepGemm& g : gemms) {
        const std::size_t es = dtype_size(g.dtype);
        w_bytes = std::max<std::size_t>(w_bytes, g.in * g.out * es);
        const int64_t widest = std::max({g.in, g.out, g.ld_in, g.ld_out});  // (LoRA's slices: the whole rows)
        act_bytes = std::max<std::size_t>(act_bytes, g.tokens * widest * es);
        out_bytes = std::max<std::size_t>(out_bytes, std::max<std::size_t>(g.tokens * widest * es, g.in * g.out * 4));
        bias_bytes = std::max<std::size_t>(bias_bytes, g.out * 4);
    }
    Operands p{device_bytes(w_bytes), device_bytes(act_bytes), device_bytes(act_bytes), device_bytes(out_bytes),
               device_bytes(bias_bytes), nullptr};
    const float one = 1.0f;
    CK(cudaMalloc(&p.scale, 16));
    CK(cudaMemcpy(p.scale, &one, sizeof one, cudaMemcpyHostToDevice));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));

    GemmRunner heuristic(kGemmWorkspaceBytes, false), tuned(kGemmWorkspaceBytes, true);
    std::printf("%s on %s, micro-batch %d x %d = %lld tokens; ms per call (the mean of back-to-back calls); %s operands\n",
                c.architecture.c_str(), prop.name, B, T, static_cast<long long>(N),
                g_random_operands ? "random" : "constant");
    std::printf("%-20s %6s %6s %6s %5s %-14s | %9s %7s | %9s %7s | %9s\n", "gemm", "tokens", "in", "out", "calls",
                "operands", "heuristic", "TF/s", "tuned", "TF/s", "ms/mb");
    double heur_total = 0, best_total = 0, flop_total = 0;
    std::vector<bool> tuned_faster;  // per GEMM: the runner --sustain's sequence calls
    // the best times under the op timer's names (QTRAIN_TIME_BREAKDOWN=1), to set beside its lines
    std::map<std::string, double> by_timer;
    auto timer_line = [](const StepGemm& g) -> std::string {
        if (g.lora) return "lora gemm";
        if (g.name.find("lm head") != std::string::npos) return "lm head gemm";
        switch (g.pass) {  // (the op timer counts the recompute's GEMMs under "gemm fwd": its scopes nest)
            case GemmPass::Forward:
            case GemmPass::Recompute: return "gemm fwd";
            case GemmPass::InputGrad: return "gemm bwd dx";
            case GemmPass::WeightGrad: return "gemm bwd dw";
        }
        return "?";
    };
    for (const StepGemm& g : gemms) {
        const double flop1 = 2.0 * g.tokens * g.in * g.out;
        const int reps = std::clamp(static_cast<int>(2e13 / flop1), 5, 200);
        auto call_h = [&] { run_gemm(heuristic, g, p, s); };
        auto call_t = [&] { run_gemm(tuned, g, p, s); };
        const double h_ms = time_calls(call_h, s, 2, reps);
        // the tuned runner tries its candidates on its first calls (cuda/gemm.h) and decides once their
        // timings are read, which it does without waiting: calls made back to back all run while it is
        // still trying (session 24 on the H200: "10 still exploring", the LM head's dx 45% slower than the
        // heuristic's). So each trial call waits for the GPU, until no shape is still being tried.
        const int trials = GemmRunner::kAutotuneCandidates * (GemmRunner::kAutotuneSamples + 1) + 2;
        for (int i = 0; i < 4 * trials && (i < 2 || tuned.tuning_stats().shapes_exploring > 0); ++i) {
            call_t();
            CK(cudaStreamSynchronize(s));
        }
        const double tuned_ms = time_calls(call_t, s, 2, reps);
        // the floor takes the faster of the two (a choice timed in place can lose back to back: gemm_autotune.h)
        const double t_ms = std::min(h_ms, tuned_ms);
        tuned_faster.push_back(tuned_ms < h_ms);
        const DType second = g.pass == GemmPass::Forward || g.pass == GemmPass::Recompute ? DType::E4M3 : g.grad_dtype;
        const std::string ops = g.fp8 ? "e4m3 x " + std::string(dtype_name(second)) + (g.fast_accum ? " fast" : "")
                                      : std::string(dtype_name(g.dtype));
        std::printf("%-20s %6lld %6lld %6lld %5d %-14s | %9.4f %7.1f | %9.4f %7.1f | %9.3f%s\n", g.name.c_str(),
                    static_cast<long long>(g.tokens), static_cast<long long>(g.in), static_cast<long long>(g.out),
                    g.calls, ops.c_str(), h_ms, flop1 / (h_ms * 1e9), tuned_ms, flop1 / (tuned_ms * 1e9), t_ms * g.calls,
                    g.beta != 0.0f ? "  (beta 1)" : "");
        heur_total += h_ms * g.calls;
        best_total += t_ms * g.calls;
        by_timer[timer_line(g)] += t_ms * g.calls;
        flop_total += g.flop();
    }
    std::printf("best per micro-batch under the op timer's names:");
    for (const auto& [line, ms] : by_timer) std::printf("  %s %.2f ms", line.c_str(), ms);
    std::printf("\n");
    const GemmTuningStats st = tuned.tuning_stats();
    std::printf("GEMMs per micro-batch: %.2f ms with the heuristic's choice, %.2f ms with each GEMM's faster of it and "
                "the autotuner's pick of %d candidates (%.1f TFLOP/s over %.3g flop; %d shapes tuned, %d still exploring)\n",
                heur_total, best_total, GemmRunner::kAutotuneCandidates, flop_total / (best_total * 1e9), flop_total,
                st.shapes_tuned, st.shapes_exploring);

    // attention: the backend and shape the model would use (not with document masking: its kernels
    // depend on the documents)
    double att_fwd = 0, att_bwd = 0;
    int att_fwd_calls = 1;
    const bool recompute_att = o.recompute_att || o.recompute_block;
    if (recompute_att) att_fwd_calls = 2;
    const AttentionBackend backend = choose_attention_backend(c, o);
    const AttentionShape as = attention_shape(c, o, B, T, backend);
    const DType A = o.model_dtype;
    void *qkv = nullptr, *dqkv = nullptr, *att_out = nullptr, *dout = nullptr, *ws = nullptr;
    float* lse = nullptr;
    auto att_forward = [&] { attention_forward(A, att_out, lse, qkv, as, s, nullptr, backend, ws); };
    auto att_backward = [&] {
        attention_backward(A, dqkv, dout, qkv, att_out, lse, ws, as, s, o.attn_bwd_chunks, backend);
    };
    {
        const std::size_t es = dtype_size(A);
        const std::size_t qkv_n = static_cast<std::size_t>(N) * (as.Hq + 2 * as.Hkv) * as.D;
        const std::size_t out_n = static_cast<std::size_t>(N) * as.Hq * as.D;
        qkv = device_bytes(qkv_n * es);
        dqkv = device_bytes(qkv_n * es);
        att_out = device_bytes(out_n * es);
        dout = device_bytes(out_n * es);
        lse = static_cast<float*>(device_bytes(static_cast<std::size_t>(B) * as.Hq * T * 4, false));  // (the
        // forward writes it, and the output, before any backward reads them)
        const std::size_t ws_bytes = attention_backward_workspace_bytes(A, as, o.attn_bwd_chunks, backend);
        ws = ws_bytes ? device_bytes(ws_bytes, false) : nullptr;
        att_fwd = time_calls(att_forward, s, 2, 10);
        att_bwd = time_calls(att_backward, s, 2, 10);
    }
    const double att_flop = 4.0 * B * as.Hq * static_cast<double>(T) * T * as.D / 2 * (att_fwd_calls + 2.5);
    std::printf("attention (%s, B %d T %d Hq %d Hkv %d D %d, backward in %d chunks): forward %.3f ms (x%d), backward "
                "%.3f ms: %.2f ms per micro-batch over %d layers (%.1f TFLOP/s, causal flop counted as SDPA does)\n",
                backend == AttentionBackend::Cudnn ? "cudnn" : "flash", B, T, as.Hq, as.Hkv, as.D, o.attn_bwd_chunks,
                att_fwd, att_fwd_calls, att_bwd, (att_fwd * att_fwd_calls + att_bwd) * c.num_hidden_layers,
                c.num_hidden_layers, att_flop / ((att_fwd * att_fwd_calls + att_bwd) * 1e9));
    const double att_total = (att_fwd * att_fwd_calls + att_bwd) * c.num_hidden_layers;
    const Sustained sus = sustain_s > 0 ? run_sustained(
                                              [&] {
                                                  for (std::size_t i = 0; i < gemms.size(); ++i)
                                                      for (int k = 0; k < gemms[i].calls; ++k)
                                                          run_gemm(tuned_faster[i] ? tuned : heuristic, gemms[i], p, s);
                                                  for (int l = 0; l < c.num_hidden_layers; ++l) {
                                                      for (int k = 0; k < att_fwd_calls; ++k) att_forward();
                                                      att_backward();
                                                  }
                                              },
                                              s, sustain_s, best_total + att_total)
                                        : Sustained{};
    for (void* q : {qkv, dqkv, att_out, dout, static_cast<void*>(lse), ws})
        if (q) CK(cudaFree(q));

    // the copy rate: the elementwise ops' floor (bytes read + written)
    const std::size_t copy_bytes = std::size_t{1} << 30;
    void* src = device_bytes(copy_bytes, false);
    void* dst = device_bytes(copy_bytes, false);
    const double copy_ms =
        time_calls([&] { CK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, s)); }, s, 2, 10);
    const double copy_tbs = 2.0 * copy_bytes / (copy_ms * 1e9);
    // the read rate (the model's own abs-max reduction over 1 GiB): the fastest a kernel moves bytes, and
    // the rate at which the memory-bound ops' floors are taken (a kernel reading more than it writes beats
    // the copy rate: session 21's SwiGLU ran above it)
    float* amax = nullptr;
    CK(cudaMalloc(&amax, 16));
    const double read_ms =
        time_calls([&] { cuda::abs_max(amax, DType::BF16, src, static_cast<int64_t>(copy_bytes / 2), s); }, s, 2, 10);
    const double read_tbs = copy_bytes / (read_ms * 1e9);
    const double hbm_tbs = std::max(copy_tbs, read_tbs);
    std::printf("device copy: %.2f TB/s (read + write); read (abs-max): %.2f TB/s\n", copy_tbs, read_tbs);

    // PCIe: pinned host to device (the offloaded optimizer reads and writes its state this way)
    void* pinned = nullptr;
    const std::size_t pcie_bytes = std::size_t{1} << 29;
    CK(cudaMallocHost(&pinned, pcie_bytes));
    const double h2d_ms =
        time_calls([&] { CK(cudaMemcpyAsync(dst, pinned, pcie_bytes, cudaMemcpyHostToDevice, s)); }, s, 1, 5);
    const double pcie_gbs = pcie_bytes / (h2d_ms * 1e6);
    std::printf("PCIe host to device (pinned): %.1f GB/s\n", pcie_gbs);

    // the memory-bound ops at the faster of the two rates (model/cuda/step_traffic.h); the optimizer once per step
    const int GA = std::max(1, topt.grad_accumulation);
    double elem_ms = 0, per_step_ms = 0;
    std::printf("%-34s %12s %12s | %10s\n", "memory-bound op (op timer name)", "device GB", "PCIe GB", "floor ms");
    for (const StepTraffic& t : step_traffic(c, o)) {
        const double ms = t.device_bytes / (hbm_tbs * 1e9) + t.host_bytes / (pcie_gbs * 1e6);
        std::printf("%-34s %12.3f %12.3f | %10.3f%s\n", t.name.c_str(), t.device_bytes / 1e9, t.host_bytes / 1e9, ms,
                    t.per_step ? " per optimizer step" : "");
        (t.per_step ? per_step_ms : elem_ms) += ms;
    }
    std::printf("(PCIe at the one-way rate: an optimizer that reads and writes at once may take down to half)\n");

    const double floor_ms = best_total + att_total;
    const double all_ms = floor_ms + elem_ms + per_step_ms / GA;
    std::printf("floor of GEMMs + attention: %.2f ms per micro-batch of %lld tokens = at most %.0f tokens/s\n", floor_ms,
                static_cast<long long>(N), N / (floor_ms * 1e-3));
    std::printf("+ the memory-bound ops at %.2f TB/s (%.2f ms) and the optimizer over %d micro-batches (%.2f ms "
                "a step): %.2f ms = at most %.0f tokens/s (the recompute's elementwise ops and host copies not counted)\n",
                hbm_tbs, elem_ms, GA, per_step_ms, all_ms, N / (all_ms * 1e-3));
    if (sus.ms > 0)
        std::printf("sustained: GEMMs + attention in sequence %.2f ms a micro-batch (%.1f%% of the burst sum's rate), "
                    "+ the memory-bound ops and the optimizer: %.2f ms = at most %.0f tokens/s\n",
                    sus.ms, 100.0 * floor_ms / sus.ms, sus.ms + elem_ms + per_step_ms / GA,
                    N / ((sus.ms + elem_ms + per_step_ms / GA) * 1e-3));
    std::printf("{\"model\": \"%s\", \"batch\": %d, \"seq\": %d, \"gemm_ms_heuristic\": %.3f, \"gemm_ms_best\": %.3f, "
                "\"attention_ms\": %.3f, \"memory_bound_ms\": %.3f, \"optimizer_ms_per_step\": %.3f, \"grad_accumulation\": %d, "
                "\"copy_tb_s\": %.3f, \"read_tb_s\": %.3f, \"pcie_gb_s\": %.1f, \"floor_tokens_per_s\": %.0f, "
                "\"floor_all_tokens_per_s\": %.0f, \"sustained_ms\": %.3f, \"sustained_sm_mhz\": %d, \"sustained_w\": %.0f, "
                "\"floor_all_sustained_tokens_per_s\": %.0f, \"operands\": \"%s\"}\n",
                topt.model.c_str(), B, T, heur_total, best_total, att_total, elem_ms, per_step_ms, GA, copy_tbs,
                read_tbs, pcie_gbs, N / (floor_ms * 1e-3), N / (all_ms * 1e-3), sus.ms, sus.sm_mhz, sus.watts,
                sus.ms > 0 ? N / ((sus.ms + elem_ms + per_step_ms / GA) * 1e-3) : 0.0,
                g_random_operands ? "random" : "constant");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "step_floor_bench: %s\n", e.what());
        return 1;
    }
}
