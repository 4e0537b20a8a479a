// Helpers for GPU tests: skip cleanly without a GPU, device buffers, fp32/bf16 conversions on the
// host, and error metrics against the CPU reference.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "core/dtype.h"
#include "core/rng.h"
#include "cuda/check.h"
#include "cuda/device.h"

namespace qtrain::gputest {

// Use at the top of every GPU test.
#define QTRAIN_REQUIRE_GPU()                                                \
    do {                                                                    \
        if (::qtrain::cuda_device_count() == 0) GTEST_SKIP() << "no GPU";   \
    } while (0)

// A device array holding `n` elements of dtype `t`, filled from / read back as fp32.
class DeviceArray {
public:
    DeviceArray(std::size_t n, DType t) : n_(n), t_(t) {
        CUDA_CHECK(cudaMalloc(&p_, std::max<std::size_t>(1, n * dtype_size(t))));
        CUDA_CHECK(cudaMemset(p_, 0, std::max<std::size_t>(1, n * dtype_size(t))));
    }
    DeviceArray(const std::vector<float>& host, DType t) : DeviceArray(host.size(), t) { upload(host); }
    ~DeviceArray() { cudaFree(p_); }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;

    void upload(const std::vector<float>& host) {
        if (t_ == DType::F32) {
            CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * 4, cudaMemcpyHostToDevice));
        } else {
            std::vector<uint16_t> raw(n_);
            for (std::size_t i = 0; i < n_; ++i) raw[i] = float_to_bf16(host[i]);
            CUDA_CHECK(cudaMemcpy(p_, raw.data(), n_ * 2, cudaMemcpyHostToDevice));
        }
    }
    std::vector<float> download() const {
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> out(n_);
        if (t_ == DType::F32) {
            CUDA_CHECK(cudaMemcpy(out.data(), p_, n_ * 4, cudaMemcpyDeviceToHost));
        } else {
            std::vector<uint16_t> raw(n_);
            CUDA_CHECK(cudaMemcpy(raw.data(), p_, n_ * 2, cudaMemcpyDeviceToHost));
            for (std::size_t i = 0; i < n_; ++i) out[i] = bf16_to_float(raw[i]);
        }
        return out;
    }
    void* get() const { return p_; }
    float* f32() const { return static_cast<float*>(p_); }

private:
    void* p_ = nullptr;
    std::size_t n_;
    DType t_;
};

inline std::vector<float> random_vector(std::size_t n, uint64_t seed, float scale = 1.0f) {
    Rng r(seed);
    std::vector<float> v(n);
    for (auto& x : v) x = scale * r.normal();
    return v;
}

// Rounds every element through bf16 (to give the CPU reference the inputs the GPU really sees).
inline std::vector<float> bf16_rounded(std::vector<float> v) {
    for (auto& x : v) x = bf16_to_float(float_to_bf16(x));
    return v;
}

// max |a - b| / max |b|: one number per tensor, robust to tiny reference values.
inline double rel_max_error(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, ref = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
        ref = std::max(ref, std::fabs(static_cast<double>(b[i])));
    }
    return ref > 0 ? diff / ref : diff;
}

inline double cosine(const std::vector<float>& a, const std::vector<float>& b) {
    double ab = 0, aa = 0, bb = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        ab += static_cast<double>(a[i]) * b[i];
        aa += static_cast<double>(a[i]) * a[i];
        bb += static_cast<double>(b[i]) * b[i];
    }
    if (aa == 0 && bb == 0) return 1.0;
    return ab / std::sqrt(aa * bb);
}

}  // namespace qtrain::gputest
