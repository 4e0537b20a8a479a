// What the standalone GEMM benchmarks (overlap_bench, lora_overlap_bench) set up alike: one TN FP8 GEMM
// through cuBLASLt with the heuristic's first algorithm, fast accumulation and unit scales, and a
// CUDA-event timer of a stream's work. Operands hold small constant values: only the time is measured.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <functional>

#include "bench_check.h"

// C[m, n] (column-major, c_type) = A[k, m]^T B[k, n] (+ beta C): A e4m3, B b_type; sm_target > 0 asks
// cuBLASLt to plan for that many SMs (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), 0 for every SM.
struct LtFp8Gemm {
    static constexpr size_t kWorkspace = 32ull << 20;
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    void *A, *B, *C, *ws;
    float* scale;
    float beta;

    LtFp8Gemm(cublasLtHandle_t handle, int64_t m, int64_t n, int64_t k, cudaDataType b_type, cudaDataType c_type,
              float beta_, int sm_target = 0)
        : h(handle), beta(beta_) {
        LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof nn));
        int8_t fa = 1;
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa));
        if (sm_target > 0) {
            int32_t sms = sm_target;
            LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof sms));
        }
        CK(cudaMalloc(&scale, 16));
        const float one = 1.0f;
        CK(cudaMemcpy(scale, &one, 4, cudaMemcpyHostToDevice));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale, sizeof scale));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale, sizeof scale));
        LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k));
        LT(cublasLtMatrixLayoutCreate(&lb, b_type, k, n, k));
        LT(cublasLtMatrixLayoutCreate(&lc, c_type, m, n, m));
        cublasLtMatmulPreference_t pref;
        LT(cublasLtMatmulPreferenceCreate(&pref));
        size_t wsb = kWorkspace;
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        LT(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &res, &found));
        bench_fail_if(found == 0, "cublasLtMatmulAlgoGetHeuristic", "no algorithm", __FILE__, __LINE__);
        algo = res.algo;
        cublasLtMatmulPreferenceDestroy(pref);
        const size_t c_bytes = c_type == CUDA_R_32F ? 4 : 2;
        CK(cudaMalloc(&A, m * k));
        CK(cudaMalloc(&B, n * k));
        CK(cudaMalloc(&C, m * n * c_bytes));
        CK(cudaMalloc(&ws, kWorkspace));
        CK(cudaMemset(A, 0x30, m * k));  // 0x30: a small normal value in both FP8 formats
        CK(cudaMemset(B, 0x30, n * k));
        CK(cudaMemset(C, 0, m * n * c_bytes));
    }
    ~LtFp8Gemm() {
        cudaFree(A), cudaFree(B), cudaFree(C), cudaFree(ws), cudaFree(scale);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(desc);
    }
    LtFp8Gemm(const LtFp8Gemm&) = delete;
    LtFp8Gemm& operator=(const LtFp8Gemm&) = delete;
    void run(cudaStream_t s) {
        const float alpha = 1.0f;
        LT(cublasLtMatmul(h, desc, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &algo, ws, kWorkspace, s));
    }
};

// Milliseconds per call of `body` (what it queues on stream s), over `reps` calls after one warm-up.
inline float time_ms(const std::function<void()>& body, cudaStream_t s, int reps) {
    body();  // warm-up (module loading, algorithm choices)
    CK(cudaStreamSynchronize(s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, s));
    for (int r = 0; r < reps; ++r) body();
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms / reps;
}
