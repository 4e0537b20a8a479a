// Matmuls of the CPU reference model. Everything goes through one row-major gemm so that the BLAS /
// no-BLAS choice lives in one place; with OpenBLAS the matmuls are most of the run time, without it
// the loops below are slow but correct (CI builds without BLAS still test the same code above).
#include "model/cpu/cpu_ops.h"
#include "model/cpu/cpu_parallel.h"

#include <algorithm>
#include <vector>

#ifdef QTRAIN_HAVE_BLAS
#include <cblas.h>
#endif

namespace qtrain::cpu {

#ifndef QTRAIN_HAVE_BLAS
// One output row per iteration, each element summed over k in order: parallel and deterministic.
static void gemm_loops(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                       int ldb, float beta, float* C, int ldc) {
#pragma omp parallel if (int64_t{M} * N * K > kMinParallelWork)
    {
        std::vector<float> acc(static_cast<size_t>(N));
#pragma omp for schedule(static)
        for (int i = 0; i < M; ++i) {
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int k = 0; k < K; ++k) {
                const float a = ta ? A[static_cast<int64_t>(k) * lda + i] : A[static_cast<int64_t>(i) * lda + k];
                if (a == 0.0f) continue;
                if (!tb) {
                    const float* b = B + static_cast<int64_t>(k) * ldb;
                    for (int j = 0; j < N; ++j) acc[j] += a * b[j];
                } else {
                    for (int j = 0; j < N; ++j) acc[j] += a * B[static_cast<int64_t>(j) * ldb + k];
                }
            }
            float* c = C + static_cast<int64_t>(i) * ldc;
            for (int j = 0; j < N; ++j) c[j] = alpha * acc[j] + (beta == 0.0f ? 0.0f : beta * c[j]);
        }
    }
}
#endif

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
    if (M <= 0 || N <= 0) return;
#ifdef QTRAIN_HAVE_BLAS
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
#else
    gemm_loops(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC, int OC) {
    gemm(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, 0.0f, out, OC);
    if (!bias) return;
#pragma omp parallel for schedule(static) if (int64_t{N} * OC > kMinParallelWork)
    for (int n = 0; n < N; ++n) {
        float* o = out + static_cast<int64_t>(n) * OC;
        for (int c = 0; c < OC; ++c) o[c] += bias[c];
    }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC) {
    if (dinp) gemm(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, 1.0f, dinp, IC);
    if (dweight) gemm(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
    if (dbias) {
        // Rows in order for every column: cheap (N*OC adds) and independent of the thread count.
        for (int n = 0; n < N; ++n) {
            const float* d = dout + static_cast<int64_t>(n) * OC;
            for (int c = 0; c < OC; ++c) dbias[c] += d[c];
        }
    }
}

}  // namespace qtrain::cpu
