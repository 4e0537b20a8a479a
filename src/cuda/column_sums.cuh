// Deterministic column sums of an [N, C] matrix (optionally of a product of two matrices and a
// per-row factor): G blocks each sum a fixed, strided subset of rows into partials[G, C], then a
// second pass adds the G partials per column with a fixed tree (32 strided lanes per column, then
// the 32 lane sums in order). No atomics, so the result never varies; G is a constant, not a
// function of the GPU, so it does not vary across GPUs either.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/kernel_utils.cuh"

namespace qtrain::cuda {

constexpr int kColumnSumBlocks = 1024;

inline int column_sum_blocks(int N) { return N < kColumnSumBlocks ? (N > 0 ? N : 1) : kColumnSumBlocks; }

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

// The same partials with 16-byte loads: each thread sums P = 16 / sizeof(T) adjacent columns, over
// the same rows in the same order, so every partial is bit-identical to column_partials_kernel's
// (which issues P times as many 2-byte loads). Needs 16-byte aligned rows (C a multiple of P).
template <class T>
__global__ void column_partials_vec_kernel(float* partial, const T* a, const T* b_mat, const float* row, int N,
                                           int C) {
    constexpr int P = Pack<T>::N;
    const int G = gridDim.y;
    const int blk = blockIdx.y;
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (c >= C) return;
    float acc[P] = {};
    for (int r = blk; r < N; r += G) {
        const int64_t i = static_cast<int64_t>(r) * C + c;
        Pack<T> va, vb;
        va.load(a + i);
        if (b_mat) vb.load(b_mat + i);
#pragma unroll
        for (int k = 0; k < P; ++k) {
            float v = va.v[k];
            if (b_mat) v *= vb.v[k];
            if (row) v *= row[r];
            acc[k] += v;
        }
    }
    float* out = partial + static_cast<int64_t>(blk) * C + c;
#pragma unroll
    for (int k = 0; k < P; k += 4) *reinterpret_cast<float4*>(out + k) = make_float4(acc[k], acc[k + 1], acc[k + 2], acc[k + 3]);
}

// out[c] += sum_b partial[b, c]. Block (32, 32): x = column within a tile of 32, y = lane over b.
template <class Unused = void>
__global__ void column_reduce_kernel(float* out, const float* partial, int G, int C) {
    __shared__ float lanes[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (c < C)
        for (int b = threadIdx.y; b < G; b += 32) acc += partial[static_cast<int64_t>(b) * C + c];
    lanes[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float total = 0.0f;
        for (int y = 0; y < 32; ++y) total += lanes[y][threadIdx.x];
        out[c] += total;
    }
}

inline void column_reduce(float* out, const float* partial, int G, int C, cudaStream_t s) {
    column_reduce_kernel<><<<ceil_div(C, 32), dim3(32, 32), 0, s>>>(out, partial, G, C);
}

template <class T>
inline void column_sums(float* out, float* scratch, const T* a, const T* b_mat, const float* row, int N, int C,
                        cudaStream_t s) {
    const int G = column_sum_blocks(N);
    constexpr int P = Pack<T>::N;
    const bool vec = rows_vectorizable<T>(a, C) && (b_mat == nullptr || rows_vectorizable<T>(b_mat, C)) &&
                     reinterpret_cast<uintptr_t>(scratch) % 16 == 0;
    if (vec) {
        const int threads = std::min<int>(256, static_cast<int>(ceil_div(C / P, 32)) * 32);
        column_partials_vec_kernel<T><<<dim3(ceil_div(C / P, threads), G), threads, 0, s>>>(scratch, a, b_mat, row, N, C);
    } else {
        column_partials_kernel<T><<<dim3(ceil_div(C, 128), G), 128, 0, s>>>(scratch, a, b_mat, row, N, C);
    }
    column_reduce(out, scratch, G, C, s);
}

}  // namespace qtrain::cuda
