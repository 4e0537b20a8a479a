// Would the step gain from running its weight-gradient GEMMs on a second stream, beside the
// memory-bound kernels of the backward? Times one FP8 dW GEMM (cuBLASLt, first heuristic choice,
// fast accumulation, accumulating into fp32 as CudaModel::linear_bwd does) and one memory-bound
// kernel of the backward: alone, one after the other on one stream, and on two streams at once.
// The floor analysis in docs/perf-notes.md sums op times; overlap is the only way below that sum,
// and it only helps if the GEMM leaves SM room (registers, shared memory, wave tails) for the other
// kernel. usage: overlap_bench [model=0.5b|1.5b] [tokens=16384]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_check.h"
#include "bench_lt_fp8_gemm.h"
#include "core/dtype.h"
#include "cuda/fp8.h"
#include "cuda/kernels.h"

using qtrain::DType;

int main(int argc, char** argv) {
    const std::string model = argc > 1 ? argv[1] : "0.5b";
    const int64_t N = argc > 2 ? std::atoll(argv[2]) : 16384;
    int64_t d = 896, ffn = 4864, kv = 128;
    if (model == "1.5b") {
        d = 1536; ffn = 8960; kv = 256;
    } else if (model != "0.5b") {
        std::fprintf(stderr, "model must be 0.5b or 1.5b\n");
        return 2;
    }
    const int64_t qkv = d + 2 * kv;
    cublasLtHandle_t h;
    LT(cublasLtCreate(&h));
    int lo = 0, hi = 0;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t main_s, side_s, side_hi;
    CK(cudaStreamCreateWithFlags(&main_s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&side_s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithPriority(&side_hi, cudaStreamNonBlocking, hi));
    cudaEvent_t fork, join;
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

    // memory-bound kernels of the backward, on bf16 tensors of the step's sizes
    void *big, *bigq, *bigqt, *dres, *dnorm, *inp, *w, *g_gu;
    float *amax, *inv, *rstd, *dweight, *scratch;
    const int64_t nbig = N * ffn, nsmall = N * d;
    CK(cudaMalloc(&big, nbig * 2));
    CK(cudaMalloc(&bigq, nbig * 2));
    CK(cudaMalloc(&bigqt, nbig * 2));
    CK(cudaMalloc(&g_gu, nbig * 4));
    CK(cudaMalloc(&dres, nsmall * 2));
    CK(cudaMalloc(&dnorm, nsmall * 2));
    CK(cudaMalloc(&inp, nsmall * 2));
    CK(cudaMalloc(&w, d * 2));
    CK(cudaMalloc(&amax, 16));
    CK(cudaMalloc(&inv, 16));
    CK(cudaMalloc(&rstd, N * 4));
    CK(cudaMalloc(&dweight, d * 4));
    CK(cudaMalloc(&scratch, qtrain::cuda::rmsnorm_backward_scratch_floats(static_cast<int>(N), static_cast<int>(d)) * 4));
    CK(cudaMemset(big, 0x3c, nbig * 2));  // bf16 0x3c3c ~ 0.011
    CK(cudaMemset(g_gu, 0x3c, nbig * 4));
    CK(cudaMemset(dres, 0x3c, nsmall * 2));
    CK(cudaMemset(dnorm, 0x3c, nsmall * 2));
    CK(cudaMemset(inp, 0x3c, nsmall * 2));
    CK(cudaMemset(w, 0x3c, d * 2));
    CK(cudaMemset(rstd, 0, N * 4));
    const float one = 1.0f;
    CK(cudaMemcpy(amax, &one, 4, cudaMemcpyHostToDevice));

    struct Mem {
        const char* name;
        std::function<void(cudaStream_t)> run;
    };
    std::vector<Mem> mems = {
        {"quantize+T [N,I]",
         [&](cudaStream_t s) {
             qtrain::cuda::quantize_fp8_transpose(bigqt, DType::E5M2, big, DType::BF16, N, ffn, amax, inv, s, bigq);
         }},
        {"swiglu-bwd+quant",
         [&](cudaStream_t s) {
             qtrain::cuda::swiglu_backward_quantize_transpose(bigqt, bigq, DType::E5M2, big, g_gu, DType::BF16,
                                                              static_cast<int>(N), static_cast<int>(ffn), amax, inv, s);
         }},
        {"rmsnorm bwd [N,h]",
         [&](cudaStream_t s) {
             qtrain::cuda::rmsnorm_backward(DType::BF16, dres, dweight, scratch, dnorm, inp, w, rstd,
                                            static_cast<int>(N), static_cast<int>(d), s);
         }},
    };
    struct G {
        const char* name;
        int64_t m, n;
    };
    const std::vector<G> gemms = {{"dw qkv", d, qkv}, {"dw o", d, d}, {"dw gate_up", d, 2 * ffn}, {"dw down", ffn, d}};

    std::printf("%s, %lld tokens; ms per pair (GEMM + memory kernel); overlap = (serial - concurrent) / min(gemm, mem)\n",
                model.c_str(), static_cast<long long>(N));
    std::printf("%-12s %-20s %8s %8s %8s %10s %10s %8s\n", "gemm", "memory kernel", "gemm", "mem", "serial",
                "two-stream", "gemm-high", "overlap");
    const int reps = 30;
    for (const auto& g : gemms) {
        LtFp8Gemm gemm(h, g.m, g.n, N, CUDA_R_8F_E5M2, CUDA_R_32F, 1.0f);  // (dW: fp32, accumulated)
        for (const auto& m : mems) {
            const float tg = time_ms([&] { gemm.run(main_s); }, main_s, reps);
            const float tm = time_ms([&] { m.run(main_s); }, main_s, reps);
            const float ts = time_ms([&] { gemm.run(main_s); m.run(main_s); }, main_s, reps);
            auto concurrent = [&](cudaStream_t gemm_stream) {
                return time_ms(
                    [&] {
                        CK(cudaEventRecord(fork, main_s));
                        CK(cudaStreamWaitEvent(gemm_stream, fork));
                        gemm.run(gemm_stream);
                        m.run(main_s);
                        CK(cudaEventRecord(join, gemm_stream));
                        CK(cudaStreamWaitEvent(main_s, join));
                    },
                    main_s, reps);
            };
            const float tc = concurrent(side_s), tch = concurrent(side_hi);
            std::printf("%-12s %-20s %8.4f %8.4f %8.4f %10.4f %10.4f %7.0f%%\n", g.name, m.name, tg, tm, ts, tc, tch,
                        100.0 * (ts - std::min(tc, tch)) / std::min(tg, tm));
        }
    }
    return 0;
}
