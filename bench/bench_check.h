// Error checks for the standalone GPU benchmarks: stop at the first failing CUDA or cuBLASLt call,
// naming the call, the file and the line (a benchmark has nothing to clean up or recover).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

inline void bench_fail_if(bool failed, const char* call, const char* why, const char* file, int line) {
    if (!failed) return;
    std::fprintf(stderr, "%s:%d %s: %s\n", file, line, call, why);
    std::exit(1);
}
#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        bench_fail_if(e_ != cudaSuccess, #x, cudaGetErrorString(e_), __FILE__, __LINE__);   \
    } while (0)
#define LT(x)                                                                                       \
    do {                                                                                            \
        cublasStatus_t s_ = (x);                                                                    \
        bench_fail_if(s_ != CUBLAS_STATUS_SUCCESS, #x, cublasGetStatusName(s_), __FILE__, __LINE__); \
    } while (0)
