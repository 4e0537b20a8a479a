// How much faster than cuBLASLt's first heuristic choice could the step's GEMMs run?
// For every GEMM shape of a Qwen2.5 FP8 training step (forward, dX, dW; e4m3 x e4m3 forward, e4m3 x
// e5m2 backward, as CudaModel calls them) and the bf16 LM head, times:
//   - the heuristic's first algorithm (what GemmRunner uses),
//   - the same with CUBLASLT_MATMUL_DESC_FAST_ACCUM (FP8 only),
//   - the fastest of the first K heuristic results (what an autotuner would pick).
// usage: gemm_algo_bench [model=0.5b|1.5b] [tokens=16384] [candidates=16]
// Prints one line per shape plus step totals (ms per step, each shape counted once per layer).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_check.h"

namespace {

struct Shape {
    std::string name;
    int64_t m, n, k;  // TN: A is k x m (lda = k), B is k x n (ldb = k), C is m x n
    cudaDataType_t a, b, c;
    float beta;
    int per_step;  // how many times per step (layers)
};

struct Timing {
    float ms = -1;
    int index = -1;
};

constexpr size_t kWorkspace = 32ull << 20;

// Times `cands` algorithms (or the first only) on one shape; returns ms per call for each.
std::vector<float> time_algos(cublasLtHandle_t h, const Shape& s, bool fast_accum, int cands, void* A, void* B,
                              void* C, void* ws, const float* scale, int reps) {
    const bool fp8 = s.a == CUDA_R_8F_E4M3 || s.a == CUDA_R_8F_E5M2;
    cublasLtMatmulDesc_t desc;
    LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
    if (fp8) {
        int8_t fa = fast_accum ? 1 : 0;
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale, sizeof scale));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale, sizeof scale));
    }
    cublasLtMatrixLayout_t la, lb, lc;
    LT(cublasLtMatrixLayoutCreate(&la, s.a, s.k, s.m, s.k));
    LT(cublasLtMatrixLayoutCreate(&lb, s.b, s.k, s.n, s.k));
    LT(cublasLtMatrixLayoutCreate(&lc, s.c, s.m, s.n, s.m));
    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    size_t wsb = kWorkspace;
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    std::vector<cublasLtMatmulHeuristicResult_t> res(cands);
    int found = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, cands, res.data(), &found));
    std::vector<float> out;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const float alpha = 1.0f;
    for (int i = 0; i < found; ++i) {
        bool ok = true;
        for (int w = 0; w < 3 && ok; ++w)
            ok = cublasLtMatmul(h, desc, &alpha, A, la, B, lb, &s.beta, C, lc, C, lc, &res[i].algo, ws, wsb, 0) ==
                 CUBLAS_STATUS_SUCCESS;
        if (!ok) {
            out.push_back(-1);
            continue;
        }
        CK(cudaEventRecord(e0));
        for (int r = 0; r < reps; ++r)
            cublasLtMatmul(h, desc, &alpha, A, la, B, lb, &s.beta, C, lc, C, lc, &res[i].algo, ws, wsb, 0);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        out.push_back(ms / reps);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string model = argc > 1 ? argv[1] : "0.5b";
    const int64_t N = argc > 2 ? std::atoll(argv[2]) : 16384;
    const int cands = argc > 3 ? std::atoi(argv[3]) : 16;
    int64_t d, ffn, kv, layers;
    const int64_t V = 151936;
    if (model == "0.5b") {
        d = 896; ffn = 4864; kv = 128; layers = 24;
    } else if (model == "1.5b") {
        d = 1536; ffn = 8960; kv = 256; layers = 28;
    } else {
        std::fprintf(stderr, "model must be 0.5b or 1.5b\n");
        return 2;
    }
    const int64_t qkv = d + 2 * kv;
    const auto E4 = CUDA_R_8F_E4M3, E5 = CUDA_R_8F_E5M2, BF = CUDA_R_16BF, F32 = CUDA_R_32F;
    const int L = static_cast<int>(layers);
    // FP8 shapes as CudaModel::linear_fwd / linear_bwd call them (A = weight or x^T, B = x / dy / dy^T).
    std::vector<Shape> shapes = {
        {"fwd qkv", qkv, N, d, E4, E4, BF, 0, L},       {"fwd o", d, N, d, E4, E4, BF, 0, L},
        {"fwd gate_up", 2 * ffn, N, d, E4, E4, BF, 0, L}, {"fwd down", d, N, ffn, E4, E4, BF, 0, L},
        {"dx qkv", d, N, qkv, E4, E5, BF, 0, L},        {"dx o", d, N, d, E4, E5, BF, 0, L},
        {"dx gate_up", d, N, 2 * ffn, E4, E5, BF, 0, L}, {"dx down", ffn, N, d, E4, E5, BF, 0, L},
        {"dw qkv", d, qkv, N, E4, E5, F32, 1, L},       {"dw o", d, d, N, E4, E5, F32, 1, L},
        {"dw gate_up", d, 2 * ffn, N, E4, E5, F32, 1, L}, {"dw down", ffn, d, N, E4, E5, F32, 1, L},
        // bf16 LM head, forward only in this TN form (its backward runs NN / NT in the model)
        {"lmhead fwd bf16", V, N, d, BF, BF, BF, 0, 1},
    };
    size_t maxA = 0, maxB = 0, maxC = 0;
    for (auto& s : shapes) {
        const size_t ea = s.a == BF ? 2 : 1, ec = s.c == F32 ? 4 : 2;
        maxA = std::max(maxA, static_cast<size_t>(s.m * s.k) * ea);
        maxB = std::max(maxB, static_cast<size_t>(s.n * s.k) * ea);
        maxC = std::max(maxC, static_cast<size_t>(s.m * s.n) * ec);
    }
    void *A, *B, *C, *ws;
    float* scale;
    CK(cudaMalloc(&A, maxA));
    CK(cudaMalloc(&B, maxB));
    CK(cudaMalloc(&C, maxC));
    CK(cudaMalloc(&ws, kWorkspace));
    CK(cudaMalloc(&scale, 16));
    const float one = 1.0f;
    CK(cudaMemcpy(scale, &one, 4, cudaMemcpyHostToDevice));
    // Small random-ish bytes: 0x30..0x3f is ~0.1..0.5 in both e4m3 and (as a bf16 byte pair) bf16.
    std::vector<unsigned char> host(std::max(maxA, maxB));
    unsigned x = 12345;
    for (auto& b : host) {
        x = x * 1664525u + 1013904223u;
        b = static_cast<unsigned char>(0x30 | ((x >> 24) & 0x0f) | ((x >> 20) & 0x80));
    }
    CK(cudaMemcpy(A, host.data(), maxA, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, host.data(), maxB, cudaMemcpyHostToDevice));
    CK(cudaMemset(C, 0, maxC));
    cublasLtHandle_t h;
    LT(cublasLtCreate(&h));

    std::printf("%s, %lld tokens, %d candidates; ms per call and TFLOP/s\n", model.c_str(), static_cast<long long>(N),
                cands);
    std::printf("%-16s %6s %6s %6s | %8s %7s | %8s %7s | %8s %7s %4s\n", "shape", "m", "n", "k", "heur0", "TF/s",
                "fastacc", "TF/s", "best", "TF/s", "idx");
    double tot_h = 0, tot_f = 0, tot_b = 0, tot_bf = 0;
    for (const auto& s : shapes) {
        const double flop = 2.0 * s.m * s.n * s.k;
        const int reps = std::max(5, static_cast<int>(2e12 / flop));
        auto slow = time_algos(h, s, false, cands, A, B, C, ws, scale, reps);
        const bool fp8 = s.a != BF;
        auto fast = fp8 ? time_algos(h, s, true, cands, A, B, C, ws, scale, reps) : slow;
        auto best_of = [](const std::vector<float>& v) {
            Timing t;
            for (int i = 0; i < static_cast<int>(v.size()); ++i)
                if (v[i] > 0 && (t.ms < 0 || v[i] < t.ms)) t = {v[i], i};
            return t;
        };
        const Timing b = best_of(slow), bf = best_of(fast);
        const float h0 = slow.empty() ? -1 : slow[0], f0 = fast.empty() ? -1 : fast[0];
        auto tf = [&](float ms) { return ms > 0 ? flop / (ms * 1e-3) / 1e12 : 0.0; };
        std::printf("%-16s %6lld %6lld %6lld | %8.4f %7.1f | %8.4f %7.1f | %8.4f %7.1f %4d  (best fast-accum %.4f, %zu algos)\n",
                    s.name.c_str(), static_cast<long long>(s.m), static_cast<long long>(s.n),
                    static_cast<long long>(s.k), h0, tf(h0), f0, tf(f0), b.ms, tf(b.ms), b.index, bf.ms, slow.size());
        tot_h += h0 * s.per_step;
        tot_f += f0 * s.per_step;
        tot_b += b.ms * s.per_step;
        tot_bf += bf.ms * s.per_step;
    }
    std::printf("per step (ms): heuristic %.2f, fast-accum heuristic %.2f, best of %d %.2f, best fast-accum %.2f\n",
                tot_h, tot_f, cands, tot_b, tot_bf);
    return 0;
}
