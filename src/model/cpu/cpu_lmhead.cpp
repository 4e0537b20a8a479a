// The LM head fused with softmax cross-entropy. With Qwen's 151936-token vocabulary the logits of a
// whole batch do not fit anywhere sensible (8 x 128 tokens = 622 MB), so rows go through in chunks:
// sgemm the chunk's logits, turn them into their gradient in place, and feed that straight into the
// two backward sgemms before the next chunk reuses the buffer. The exp over the vocabulary is the
// only non-matmul cost that matters, so it is written to vectorise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "model/cpu/cpu_ops.h"
#include "model/cpu/cpu_parallel.h"

namespace qtrain::cpu {

// Eight floats at a time through GCC/Clang vector extensions, lowered to whatever SIMD the target
// has (two SSE registers on baseline x86-64). Written out because without -fno-trapping-math the
// auto-vectoriser leaves any loop with a float comparison scalar; the code below compares integers
// only, which it vectorises.
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
constexpr int kLanes = 8;

// exp(x) for x <= 0 to about 1 ulp: x = k ln2 + r with |r| <= ln2/2, exp(r) by the Cephes expf
// minimax polynomial, 2^k built in the exponent bits. (std::exp is a library call per element.)
// Where 2^k would not be a normal float (x below about -87.3, or -inf) the result is 0; NaN stays
// NaN, so a broken model shows a NaN loss. (In place: passing 32-byte vectors by value has a
// different ABI with and without AVX.)
__attribute__((always_inline)) static inline void exp_nonpositive(f32x8& x) {
    i32x8 x_bits;
    std::memcpy(&x_bits, &x, sizeof x_bits);
    const i32x8 is_nan = (x_bits & 0x7fffffff) > 0x7f800000;
    // Rounds x/ln2 to the nearest integer (adding 1.5 * 2^23 pushes the fraction out of the mantissa).
    const f32x8 kf = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    f32x8 r = x - kf * 0.693359375f;  // ln2 split in two so that k*ln2 is exact in float
    r = r - kf * -2.12194440e-4f;
    f32x8 p = f32x8{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const i32x8 k = __builtin_convertvector(kf, i32x8);  // out of range (huge, NaN): INT_MIN
    const i32x8 normal = k >= -126;                      // all-ones lanes where 2^k is a normal float
    const i32x8 two_to_k = ((k + 127) << 23) & normal;
    f32x8 scale;
    std::memcpy(&scale, &two_to_k, sizeof scale);
    f32x8 e = p * scale;  // lanes outside the range: p * 0, which is NaN if p overflowed
    i32x8 bits;
    std::memcpy(&bits, &e, sizeof bits);
    bits = (bits & normal) | (x_bits & is_nan);
    std::memcpy(&x, &bits, sizeof x);
}

// Max of a row with eight independent running maxima: one running max is a chain of dependent
// 4-cycle instructions, and the float comparison keeps the loop scalar (see above) either way.
__attribute__((always_inline)) static inline float row_max(const float* row, int V) {
    float m[kLanes];
    for (int l = 0; l < kLanes; ++l) m[l] = row[0];
    const int full = V - V % kLanes;
    for (int j = 0; j < full; j += kLanes)
        for (int l = 0; l < kLanes; ++l) m[l] = std::max(m[l], row[j + l]);
    for (int j = full; j < V; ++j) m[0] = std::max(m[0], row[j]);
    return *std::max_element(m, m + kLanes);
}

// row[j] = exp(row[j] - mx); returns the sum. Lane sums over blocks of 512, blocks summed in double
// in a fixed order: a float sum over all 151936 terms would lose ~1e-5 of the loss.
__attribute__((always_inline)) static inline double exp_shifted_sum(float* row, int V, float mx) {
    constexpr int kBlock = 512;
    const int full = V - V % kLanes;
    double sum = 0.0;
    for (int j0 = 0; j0 < full; j0 += kBlock) {
        const int j1 = std::min(full, j0 + kBlock);
        f32x8 acc = {};
        for (int j = j0; j < j1; j += kLanes) {
            f32x8 v;
            std::memcpy(&v, row + j, sizeof v);
            v -= mx;
            exp_nonpositive(v);
            std::memcpy(row + j, &v, sizeof v);
            acc += v;
        }
        for (int l = 0; l < kLanes; ++l) sum += acc[l];
    }
    if (full < V) {  // the last partial vector, through the same arithmetic
        f32x8 v = {};
        std::memcpy(&v, row + full, sizeof(float) * (V - full));
        v -= mx;
        exp_nonpositive(v);
        std::memcpy(row + full, &v, sizeof(float) * (V - full));
        for (int l = 0; l < V - full; ++l) sum += v[l];
    }
    return sum;
}

int count_valid_targets(const int32_t* targets, int N) {
    int n = 0;
    for (int i = 0; i < N; ++i) n += targets[i] >= 0;
    return n;
}

// One row: returns its loss and, when write_grad is set, overwrites it with its gradient.
// On x86-64 Linux a second copy is compiled for AVX2+FMA machines (x86-64-v3) and picked at load
// time: one register holds all eight lanes, five times faster than two SSE halves. (FMA rounds the
// exp polynomial differently, so such machines differ from others in the last bit; runs on one
// machine never differ.)
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
static float
softmax_cross_entropy_row(float* row, int V, int32_t target, float dscale, bool write_grad) {
    const float mx = row_max(row, V);
    const float target_logit = row[target];
    const double sum = exp_shifted_sum(row, V, mx);
    const float loss = static_cast<float>(std::log(sum) + (static_cast<double>(mx) - target_logit));
    if (write_grad) {
        const float s = static_cast<float>(dscale / sum);
        for (int j = 0; j < V; ++j) row[j] *= s;
        row[target] -= dscale;
    }
    return loss;
}

void softmax_cross_entropy(float* logits, float* losses, const int32_t* targets, int n, int V, float dscale,
                           bool write_grad) {
    for (int i = 0; i < n; ++i)
        QT_CHECK(targets[i] < V, "cross-entropy: target ", targets[i], " at row ", i, " is outside the vocabulary (", V,
                 " tokens)");
#pragma omp parallel for schedule(static) if (int64_t{n} * V > kMinParallelWork / 8)
    for (int i = 0; i < n; ++i) {
        float* row = logits + static_cast<int64_t>(i) * V;
        if (targets[i] >= 0) {
            losses[i] = softmax_cross_entropy_row(row, V, targets[i], dscale, write_grad);
        } else {
            losses[i] = 0.0f;
            if (write_grad) std::fill(row, row + V, 0.0f);
        }
    }
}

int lmhead_chunk_rows(int N, int chunks) {
    chunks = std::clamp(chunks, 1, std::max(N, 1));
    return (N + chunks - 1) / chunks;
}

void lmhead_cross_entropy(float* losses, float* dx, float* dweight, const float* x, const float* weight,
                          const int32_t* targets, int N, int C, int V, int chunks, float dscale, float* scratch,
                          const LmHeadFp8* fp8) {
    const bool backward = dx || dweight;
    const int rows = lmhead_chunk_rows(N, chunks);
    // the forward's operands, and the backward's (quantised only with FP8 gradients)
    const float* xf = fp8 ? fp8->xq : x;
    const float* wf = fp8 ? fp8->wq : weight;
    const bool fp8_grads = fp8 && is_fp8(fp8->grad);
    const float* xb = fp8_grads ? fp8->xq : x;
    const float* wb = fp8_grads ? fp8->wq : weight;
    for (int r0 = 0; r0 < N; r0 += rows) {
        const int nr = std::min(rows, N - r0);
        if (count_valid_targets(targets + r0, nr) == 0) {  // fully masked (e.g. a prompt): nothing to do
            std::fill(losses + r0, losses + r0 + nr, 0.0f);
            continue;
        }
        gemm(false, true, nr, V, C, 1.0f, xf + static_cast<int64_t>(r0) * C, C, wf, C, 0.0f, scratch, V);
        softmax_cross_entropy(scratch, losses + r0, targets + r0, nr, V, dscale, backward);
        if (backward && fp8_grads)  // this chunk's dlogits with its own scale (the GPU's per-chunk amax)
            fake_quantize({{scratch, scratch, static_cast<int64_t>(nr) * V}}, fp8->grad);
        if (dx) gemm(false, false, nr, C, V, 1.0f, scratch, V, wb, C, 1.0f, dx + static_cast<int64_t>(r0) * C, C);
        if (dweight) gemm(true, false, V, C, nr, 1.0f, scratch, V, xb + static_cast<int64_t>(r0) * C, C, 1.0f, dweight, C);
    }
}

}  // namespace qtrain::cpu
