// Matmuls of the CPU reference model. Everything goes through one row-major gemm so that the BLAS /
// no-BLAS choice lives in one place. With OpenBLAS the matmuls are most of the run time; without it
// the plain loops below give the same results to rounding, slowly.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "model/cpu/cpu_ops.h"
#include "model/cpu/cpu_parallel.h"

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

#ifdef QTRAIN_HAVE_BLAS
// One threading runtime, not two: OpenBLAS's pthreads keep spinning after each call and fight the
// OpenMP threads of the ops in between (on two cores that halved the demo's speed). So OpenBLAS runs
// single-threaded and gemm splits C into one block per OpenMP thread. Every element of C is still
// summed over K by one call in one order, so the result does not depend on the split.
static void blas_single_threaded() {
    static const bool done = [] {
        openblas_set_num_threads(1);
        return true;
    }();
    (void)done;
}
#endif

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
    if (M <= 0 || N <= 0) return;
#ifdef QTRAIN_HAVE_BLAS
    blas_single_threaded();
    auto call = [&](int m, int n, const float* a, const float* b, float* c) {
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, K,
                    alpha, a, lda, b, ldb, beta, c, ldc);
    };
    const int threads = omp_get_max_threads();
    if (threads == 1 || static_cast<int64_t>(M) * N * K < 16 * kMinParallelWork) {
        call(M, N, A, B, C);
        return;
    }
    // Split the longer side of C into one block per thread (multiples of 16 keep the kernels' tiles whole).
    const bool split_rows = M >= N;
    const int extent = split_rows ? M : N;
    const int block = (extent / threads + 16) / 16 * 16;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < threads; ++t) {
        const int begin = t * block, len = std::min(extent, begin + block) - begin;
        if (len <= 0) continue;
        if (split_rows)  // rows of C are rows of op(A)
            call(len, N, trans_a ? A + begin : A + static_cast<int64_t>(begin) * lda, B,
                 C + static_cast<int64_t>(begin) * ldc);
        else  // columns of C are columns of op(B)
            call(M, len, A, trans_b ? B + static_cast<int64_t>(begin) * ldb : B + begin, C + begin);
    }
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
