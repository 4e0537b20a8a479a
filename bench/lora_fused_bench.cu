// LoRA's g = s dy B and dB += s dy^T u: the two cuBLASLt GEMMs LoraAdapters::backward_matrix runs per
// target (each reads the target's whole dy slice) against cuda::lora_dy_grads (one read; perf-notes
// session 26, "lever 6"), per target of Qwen2.5-7B at the 2x row's micro-batch, on random bf16 data
// (bench_random.h: the data draws the power a real step does, perf-notes session 26). Prints each target's time both
// ways, the largest difference between their results (relative to the GEMMs'), and the sum over a
// layer's seven targets times the layers. Also the kernel writing dy's e5m2 codes in the same read
// (lever 7: the frozen FP8 base's dx GEMM reads them) against quantize_fp8's own pass over as many
// elements. Then the forward's u = x [A..]^T with x's e4m3 codes (cuda::lora_u_codes, lever 8) against
// the u GEMM and quantize_fp8, per matrix. usage: lora_fused_bench [tokens=24576] [rank=16] [reps=20]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_check.h"
#include "bench_random.h"
#include "core/dtype.h"
#include "cuda/fp8.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"

namespace {

using qtrain::DType;

void* random_bf16(int64_t n, float sigma) {
    void* p = nullptr;
    CK(cudaMalloc(&p, n * 2));
    fill_random(p, n * 2, sigma);
    return p;
}

struct Target {
    const char* name;
    int64_t out, ldy, col;  // dy: the target's `out` columns from `col` of a [N, ldy] fused output gradient
    int64_t ldu, ucol;      // u and g: its rank columns from `ucol` of the stacked [N, ldu]
};

std::vector<float> bf16_to_host(const void* d, int64_t rows, int64_t ld, int64_t col, int64_t width) {
    std::vector<uint16_t> raw(static_cast<std::size_t>(rows * ld));
    CK(cudaMemcpy(raw.data(), d, raw.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<float> out(static_cast<std::size_t>(rows * width));
    for (int64_t n = 0; n < rows; ++n)
        for (int64_t j = 0; j < width; ++j) out[n * width + j] = qtrain::bf16_to_float(raw[n * ld + col + j]);
    return out;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& ref) {
    double d = 0, m = 0;
    for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - ref[i]))), m = std::max(m, double(std::fabs(ref[i])));
    return m > 0 ? d / m : d;
}

}  // namespace

int main(int argc, char** argv) {
    const int64_t N = argc > 1 ? std::atoll(argv[1]) : 24576;  // batch 12 x seq 2048
    const int r = argc > 2 ? std::atoi(argv[2]) : 16;
    const int reps = argc > 3 ? std::atoi(argv[3]) : 20;
    const int L = 28;
    const int64_t h = 3584, I = 18944, q = 3584, kv = 512;  // Qwen2.5-7B
    const float s = 2.0f;
    int device = 0, sms = 0;
    CK(cudaGetDevice(&device));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const Target targets[] = {
        {"q", q, q + 2 * kv, 0, 3 * r, 0},           {"k", kv, q + 2 * kv, q, 3 * r, r},
        {"v", kv, q + 2 * kv, q + kv, 3 * r, 2 * r}, {"o", h, h, 0, r, 0},
        {"gate", I, 2 * I, 0, 2 * r, 0},             {"up", I, 2 * I, I, 2 * r, r},
        {"down", h, h, 0, r, 0},
    };
    qtrain::GemmRunner gemm;
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::printf("LoRA dy products, Qwen2.5-7B, N=%lld, r=%d, %d SMs, random bf16 data, median of %d\n",
                static_cast<long long>(N), r, sms, reps);
    // (dy_TB/s: the bytes of dy the fused kernel reads once, over its time: against the device's read rate)
    std::printf("%-5s %8s %10s %10s %7s %10s %10s %12s %12s %9s\n", "tgt", "out", "gemms_ms", "fused_ms", "ratio", "g_diff",
                "dB_diff", "+codes_ms", "quantize_ms", "dy_TB/s");
    double sum_gemm = 0, sum_fused = 0, sum_codes = 0, sum_quant = 0;
    float* amax = nullptr;
    CK(cudaMalloc(&amax, 64));
    float* inv = amax + 4;
    auto time = [&](auto&& f) {
        f();  // warm-up (cuBLASLt's heuristic, the kernel's attribute)
        std::vector<float> ms;
        for (int i = 0; i < reps; ++i) {
            CK(cudaEventRecord(e0, st));
            f();
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float x = 0;
            CK(cudaEventElapsedTime(&x, e0, e1));
            ms.push_back(x);
        }
        std::sort(ms.begin(), ms.end());
        return double(ms[ms.size() / 2]);
    };
    for (const Target& t : targets) {
        void* dy = random_bf16(N * t.ldy, 1e-3f);
        void* B = random_bf16(t.out * r, 0.05f);
        void* u = random_bf16(N * t.ldu, 1.0f);
        void *g1 = nullptr, *g2 = nullptr;
        float *dB1 = nullptr, *dB2 = nullptr;
        CK(cudaMalloc(&g1, N * t.ldu * 2));
        CK(cudaMalloc(&g2, N * t.ldu * 2));
        CK(cudaMalloc(&dB1, t.out * r * 4));
        CK(cudaMalloc(&dB2, t.out * r * 4));
        const char* dys = static_cast<const char*>(dy) + t.col * 2;
        const char* us = static_cast<const char*>(u) + t.ucol * 2;
        const qtrain::cuda::LoraDyGradsPlan plan = qtrain::cuda::plan_lora_dy_grads(N, t.out, r, sms);
        void* ws = nullptr;
        CK(cudaMalloc(&ws, plan.workspace_bytes));
        if (!qtrain::cuda::lora_dy_grads_supported(DType::BF16, dys, t.ldy, us, t.ldu, t.out, r)) {
            std::printf("%-5s not supported by the fused kernel\n", t.name);
            return 1;
        }
        auto gemms = [&] {  // as LoraAdapters::backward_matrix: g_j = s dy_j B_j; dB_j += s dy_j^T u_j
            qtrain::GemmOp a;
            a.m = r, a.n = N, a.k = t.out;
            a.a = B, a.lda = r, a.b = dys, a.ldb = t.ldy;
            a.c = static_cast<char*>(g1) + t.ucol * 2, a.ldc = t.ldu;
            a.alpha = s, a.beta = 0.0f, a.min_alignment = 16;
            gemm.run(a, st);
            qtrain::GemmOp w;
            w.trans_b = true;
            w.m = r, w.n = t.out, w.k = N;
            w.a = us, w.lda = t.ldu, w.b = dys, w.ldb = t.ldy;
            w.c = dB1, w.c_type = DType::F32, w.ldc = r;
            w.alpha = s, w.beta = 1.0f, w.min_alignment = 16;
            gemm.run(w, st);
        };
        auto fused = [&] {
            qtrain::cuda::lora_dy_grads(plan, static_cast<char*>(g2) + t.ucol * 2, t.ldu, dB2, dys, t.ldy, B, us,
                                        t.ldu, s, ws, st);
        };
        void* codes = nullptr;
        CK(cudaMalloc(&codes, N * t.ldy));
        qtrain::cuda::abs_max(amax, DType::BF16, dy, N * t.ldy, st);
        qtrain::cuda::Fp8CodesOut lc;
        lc.codes = static_cast<char*>(codes) + t.col, lc.ldc = t.ldy, lc.type = DType::E5M2, lc.amax = amax, lc.inv_out = inv;
        auto fused_codes = [&] {
            qtrain::cuda::lora_dy_grads(plan, static_cast<char*>(g2) + t.ucol * 2, t.ldu, dB2, dys, t.ldy, B, us,
                                        t.ldu, s, ws, st, &lc);
        };
        auto quantize = [&] {  // the pass the codes replace: as many elements, contiguous
            qtrain::cuda::quantize_fp8(codes, DType::E5M2, dy, DType::BF16, N * t.out, amax, inv, st);
        };
        // one call each from zero for the comparison, then the timings (dB accumulating: same work)
        CK(cudaMemset(dB1, 0, t.out * r * 4));
        CK(cudaMemset(dB2, 0, t.out * r * 4));
        gemms();
        fused();
        CK(cudaStreamSynchronize(st));
        const double gd = rel_diff(bf16_to_host(g2, N, t.ldu, t.ucol, r), bf16_to_host(g1, N, t.ldu, t.ucol, r));
        std::vector<float> d1(t.out * r), d2(t.out * r);
        CK(cudaMemcpy(d1.data(), dB1, d1.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(d2.data(), dB2, d2.size() * 4, cudaMemcpyDeviceToHost));
        const double dd = rel_diff(d2, d1);
        const double tg = time(gemms), tf = time(fused), tc = time(fused_codes), tq = time(quantize);
        sum_gemm += tg, sum_fused += tf, sum_codes += tc, sum_quant += tq;
        std::printf("%-5s %8lld %10.4f %10.4f %7.3f %10.2e %10.2e %12.4f %12.4f %9.2f\n", t.name,
                    static_cast<long long>(t.out), tg, tf, tf / tg, gd, dd, tc, tq, N * t.out * 2.0 / (tf * 1e9));
        for (void* p : {dy, B, u, g1, g2, static_cast<void*>(dB1), static_cast<void*>(dB2), ws, codes}) CK(cudaFree(p));
    }
    std::printf("layer: gemms %.4f ms, fused %.4f ms; x %d layers: %.2f -> %.2f ms a micro-batch (saves %.2f)\n",
                sum_gemm, sum_fused, L, sum_gemm * L, sum_fused * L, (sum_gemm - sum_fused) * L);
    std::printf("with dy's codes: gemms + quantize %.2f -> fused with codes %.2f ms a micro-batch (saves %.2f)\n",
                (sum_gemm + sum_quant) * L, sum_codes * L, (sum_gemm + sum_quant - sum_codes) * L);

    // ---- the forward: u = x [A..]^T and x's codes ----
    struct Matrix {
        const char* name;
        int64_t in;
        int W;  // G r
    };
    const Matrix mats[] = {{"qkv", h, 3 * r}, {"o", q, r}, {"gate|up", h, 2 * r}, {"down", I, r}};
    std::printf("%-8s %8s %4s %10s %12s %10s %7s %10s %8s\n", "matrix", "in", "W", "u_gemm_ms", "quantize_ms", "fused_ms",
                "ratio", "u_diff", "x_TB/s");
    double f_sep = 0, f_fused = 0;
    for (const Matrix& m : mats) {
        void* x = random_bf16(N * m.in, 1.0f);
        void* A = random_bf16(m.W * m.in, 0.02f);
        void *u1 = nullptr, *u2 = nullptr, *codes = nullptr;
        CK(cudaMalloc(&u1, N * m.W * 2));
        CK(cudaMalloc(&u2, N * m.W * 2));
        CK(cudaMalloc(&codes, N * m.in));
        qtrain::cuda::abs_max(amax, DType::BF16, x, N * m.in, st);
        qtrain::cuda::Fp8CodesOut xc;
        xc.codes = codes, xc.ldc = m.in, xc.type = DType::E4M3, xc.amax = amax, xc.inv_out = inv;
        if (!qtrain::cuda::lora_u_codes_supported(DType::BF16, x, m.in, A, m.W, xc)) {
            std::printf("%-8s not supported by the fused kernel\n", m.name);
            return 1;
        }
        auto u_gemm = [&] {  // as LoraAdapters::forward_matrix: u = x [A..]^T
            qtrain::GemmOp op;
            op.trans_a = true;
            op.m = m.W, op.n = N, op.k = m.in;
            op.a = A, op.lda = m.in, op.b = x, op.ldb = m.in, op.c = u1, op.ldc = m.W;
            op.min_alignment = 16;
            gemm.run(op, st);
        };
        auto quantize = [&] { qtrain::cuda::quantize_fp8(codes, DType::E4M3, x, DType::BF16, N * m.in, amax, inv, st); };
        auto fused = [&] { qtrain::cuda::lora_u_codes(u2, m.W, x, N, m.in, A, m.W, xc, st); };
        u_gemm();
        fused();
        CK(cudaStreamSynchronize(st));
        const double ud = rel_diff(bf16_to_host(u2, N, m.W, 0, m.W), bf16_to_host(u1, N, m.W, 0, m.W));
        const double tu = time(u_gemm), tq = time(quantize), tf = time(fused);
        f_sep += tu + tq, f_fused += tf;
        std::printf("%-8s %8lld %4d %10.4f %12.4f %10.4f %7.3f %10.2e %8.2f\n", m.name, static_cast<long long>(m.in), m.W,
                    tu, tq, tf, tf / (tu + tq), ud, N * m.in * 2.0 / (tf * 1e9));
        for (void* p : {x, A, u1, u2, codes}) CK(cudaFree(p));
    }
    std::printf("forward: u gemms + quantize %.2f -> fused %.2f ms a micro-batch (saves %.2f)\n", f_sep * L, f_fused * L,
                (f_sep - f_fused) * L);
    return 0;
}
