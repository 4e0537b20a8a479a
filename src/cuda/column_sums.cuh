// Deterministic column sums of an [N, C] matrix (optionally of a product of two matrices and a
// per-row factor): G blocks each sum a fixed, strided subset of rows into partials[G, C], then one
// pass adds the G partials per column in order. No atomics, so the result never varies.
#pragma once

#include "cuda/kernel_utils.cuh"

namespace qtrain::cuda {

constexpr int kColumnSumBlocks = 128;

// partial[b, c] = sum over rows r = b, b + G, ... of a[r, c] * (b_mat ? b_mat[r, c] : 1) * (row ? row[r] : 1)
template <class T>
__global__ void column_partials_kernel(float* partial, const T* a, const T* b_mat, const float* row, int N, int C) {
    const int G = gridDim.y;
    const int blk = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int r = blk; r < N; r += G) {
        const int64_t i = static_cast<int64_t>(r) * C + c;
        float v = to_float(a[i]);
        if (b_mat) v *= to_float(b_mat[i]);
        if (row) v *= row[r];
        acc += v;
    }
    partial[static_cast<int64_t>(blk) * C + c] = acc;
}

// out[c] += sum_b partial[b, c], b in order.
template <class Unused = void>
__global__ void column_reduce_kernel(float* out, const float* partial, int G, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int b = 0; b < G; ++b) acc += partial[static_cast<int64_t>(b) * C + c];
    out[c] += acc;
}

inline int column_sum_blocks(int N) { return N < kColumnSumBlocks ? (N > 0 ? N : 1) : kColumnSumBlocks; }

template <class T>
inline void column_sums(float* out, float* scratch, const T* a, const T* b_mat, const float* row, int N, int C,
                        cudaStream_t s) {
    const int G = column_sum_blocks(N);
    dim3 grid(ceil_div(C, 128), G);
    column_partials_kernel<T><<<grid, 128, 0, s>>>(scratch, a, b_mat, row, N, C);
    column_reduce_kernel<><<<ceil_div(C, 128), 128, 0, s>>>(out, scratch, G, C);
}

}  // namespace qtrain::cuda
