// Every CUDA runtime and cuBLAS call is checked; a failure throws qtrain::Error naming the call,
// the file and line, and the library's own error string.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace qtrain {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
}

#define CUDA_CHECK(call)                                                                  \
    do {                                                                                  \
        cudaError_t qtrain_err_ = (call);                                                 \
        if (qtrain_err_ != cudaSuccess) ::qtrain::throw_cuda_error(qtrain_err_, #call, __FILE__, __LINE__); \
    } while (0)
