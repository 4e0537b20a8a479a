// Bias gradients (q/k/v biases): column sums of the output gradient, deterministic (column_sums.cuh).
#include "cuda/check.h"
#include "cuda/column_sums.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/kernels.h"

namespace qtrain::cuda {

std::size_t bias_grad_scratch_floats(int N, int C) {
    return static_cast<std::size_t>(column_sum_blocks(N)) * C;
}

void bias_grad(float* dbias, float* scratch, DType act, const void* d, int N, int C, cudaStream_t s) {
    QTRAIN_DISPATCH_ACT(act, T, column_sums<T>(dbias, scratch, static_cast<const T*>(d), nullptr, nullptr, N, C, s));
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtrain::cuda
