// Would LoRA's step gain from running the adapters' thin GEMMs on a second stream beside the frozen base's
// FP8 GEMM, with the base GEMM told to leave some SMs free (cuBLASLt's CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET)?
// docs/perf-notes.md (session 21, lever 2) and overlap_bench: without the SM limit cuBLASLt's Hopper FP8 kernels
// hold every SM for the whole GEMM, so nothing overlaps. The trade: k SMs taken from a compute-bound GEMM
// cost k/SMs of its time; the memory-bound adapters' GEMMs need only the SMs that saturate DRAM, so hiding
// them can cost less than running them after. Measured here before the step is built that way.
//
// Per matrix of Qwen2.5-7B (qkv, o, gate_up, down) at N tokens, rank r, the adapters stacked (session 22):
//   forward   base y[N,out] = xq Wq^T (e4m3, bf16 out)      beside  u[N,G r] = x A^T (bf16)
//   backward  base dx[N,in] = dyq WTq^T (e5m2 x e4m3)       beside  g = dy B, dB += dy^T u, dA += g^T x
// for each SM target: the base alone, the side alone, one after the other (base at every SM), and both at
// once; gain = serial - concurrent (positive: the overlap pays). Every operand holds small constant values:
// only the time is measured. usage: lora_overlap_bench [tokens=24576] [rank=16]
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
#include "cuda/gemm.h"

namespace {

using qtrain::DType;

void* device_bf16(int64_t n) {
    void* p = nullptr;
    CK(cudaMalloc(&p, n * 2));
    CK(cudaMemset(p, 0x3c, n * 2));  // bf16 0x3c3c ~ 0.011
    return p;
}

}  // namespace

int main(int argc, char** argv) {
    const int64_t N = argc > 1 ? std::atoll(argv[1]) : 24576;  // batch 12 x seq 2048: the 2x row's batch
    const int64_t r = argc > 2 ? std::atoll(argv[2]) : 16;
    const int64_t h = 3584, I = 18944, q = 3584, kv = 512;  // Qwen2.5-7B
    int device = 0, sms = 0;
    CK(cudaGetDevice(&device));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cublasLtHandle_t lt;
    LT(cublasLtCreate(&lt));
    qtrain::GemmRunner side_gemm;  // the adapters' GEMMs, as LoraAdapters runs them (its own workspace)
    cudaStream_t main_s, side_s;
    CK(cudaStreamCreateWithFlags(&main_s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&side_s, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

    struct Matrix {
        const char* name;
        int64_t in, out;
        int stacked;  // G: targets whose A's are one [G r, in] matrix
    };
    const std::vector<Matrix> matrices = {
        {"qkv", h, q + 2 * kv, 3}, {"o", q, h, 1}, {"gate_up", h, 2 * I, 2}, {"down", I, h, 1}};
    const std::vector<int> targets = {0, sms - 4, sms - 8, sms - 16, sms - 32};

    // the adapters' tensors, sized for the widest matrix
    const int64_t widest_in = I, widest_out = 2 * I;
    void* x = device_bf16(N * widest_in);
    void* dy = device_bf16(N * widest_out);
    void* u = device_bf16(N * 3 * r);
    void* g = device_bf16(N * 3 * r);
    void* A = device_bf16(3 * r * widest_in);
    // (B [out, G r] as one dense matrix: gate_up's is [2 I, 2 r], the largest; the model's stacked B's are
    // block-diagonal, so the bench's backward g = dy B does up to G times the model's work: an upper bound)
    int64_t widest_b = 0;
    for (const Matrix& m : matrices) widest_b = std::max<int64_t>(widest_b, m.out * m.stacked * r);
    void* B = device_bf16(widest_b);
    float *dA = nullptr, *dB = nullptr;
    CK(cudaMalloc(&dA, 3 * r * widest_in * 4));
    CK(cudaMalloc(&dB, widest_b * 4));
    CK(cudaMemset(dA, 0, 3 * r * widest_in * 4));
    CK(cudaMemset(dB, 0, widest_b * 4));

    std::printf("Qwen2.5-7B, %lld tokens, rank %lld, %d SMs; ms per pair; gain = serial - concurrent\n",
                static_cast<long long>(N), static_cast<long long>(r), sms);
    std::printf("%-8s %-4s %6s %9s %9s %9s %11s %9s\n", "matrix", "pass", "SMs", "base", "adapters", "serial",
                "concurrent", "gain");
    const int reps = 20;
    for (const Matrix& m : matrices) {
        const int64_t w = m.stacked * r;
        // forward: u = x A^T ([N, G r]); backward: g = dy B, dB += dy^T u, dA += g^T x (the stacked A's)
        auto fwd_side = [&](cudaStream_t s) { side_gemm.linear_forward(u, DType::BF16, x, A, DType::BF16, nullptr, N, m.in, w, s); };
        auto bwd_side = [&](cudaStream_t s) {
            side_gemm.linear_backward_input(g, DType::BF16, dy, B, DType::BF16, N, w, m.out, s);
            side_gemm.linear_backward_weight(dB, DType::F32, dy, u, DType::BF16, N, w, m.out, true, s);
            side_gemm.linear_backward_weight(dA, DType::F32, g, x, DType::BF16, N, m.in, w, true, s);
        };
        for (int pass = 0; pass < 2; ++pass) {
            const bool fwd = pass == 0;
            const std::function<void(cudaStream_t)> side = fwd ? std::function<void(cudaStream_t)>(fwd_side) : bwd_side;
            const int64_t gm = fwd ? m.out : m.in, gk = fwd ? m.in : m.out;
            LtFp8Gemm full(lt, gm, N, gk, fwd ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2, CUDA_R_16BF, 0.0f);
            const float t_side = time_ms([&] { side(main_s); }, main_s, reps);
            const float t_serial = time_ms([&] { full.run(main_s); side(main_s); }, main_s, reps);
            for (int target : targets) {
                LtFp8Gemm base(lt, gm, N, gk, fwd ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2, CUDA_R_16BF, 0.0f, target);
                const float t_base = time_ms([&] { base.run(main_s); }, main_s, reps);
                const float t_conc = time_ms(
                    [&] {
                        CK(cudaEventRecord(fork, main_s));
                        CK(cudaStreamWaitEvent(side_s, fork));
                        side(side_s);
                        base.run(main_s);
                        CK(cudaEventRecord(join, side_s));
                        CK(cudaStreamWaitEvent(main_s, join));
                    },
                    main_s, reps);
                std::printf("%-8s %-4s %6d %9.4f %9.4f %9.4f %11.4f %9.4f\n", m.name, fwd ? "fwd" : "bwd",
                            target ? target : sms, t_base, t_side, t_serial, t_conc, t_serial - t_conc);
            }
        }
    }
    return 0;
}
