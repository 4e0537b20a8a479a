#include "cuda/check.h"

namespace qtrain {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
    throw_error(cat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ", call, " at ", file,
                    ":", line));
}

}  // namespace qtrain
