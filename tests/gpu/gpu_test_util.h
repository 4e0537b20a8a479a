// Helpers shared by the GPU tests: skip cleanly without a GPU, move host vectors to and from the
// device (converting through bf16 on the host with the reference conversions of core/dtype.h), and
// compare a GPU result with the CPU reference, naming the worst element when they disagree.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "cuda/check.h"
#include "cuda/device.h"

namespace qtrain::test {

inline bool has_gpu() { return cuda_device_count() > 0; }

}  // namespace qtrain::test

// First statement of every GPU test: skips (not fails) where no CUDA device is visible (CI).
// (gpu_fixtures.h defines the same macro with the same meaning; whichever comes first wins.)
#ifndef QTRAIN_REQUIRE_GPU
#define QTRAIN_REQUIRE_GPU()                                                     \
    do {                                                                         \
        if (!::qtrain::test::has_gpu()) GTEST_SKIP() << "no CUDA device found";  \
    } while (0)
#endif

namespace qtrain::test {

// An owning device allocation (raw bytes; typed access through as<T>()).
class DeviceMemory {
public:
    DeviceMemory() = default;
    explicit DeviceMemory(std::size_t bytes) : bytes_(bytes) {
        if (bytes_ > 0) CUDA_CHECK(cudaMalloc(&ptr_, bytes_));
    }
    ~DeviceMemory() {
        if (ptr_) cudaFree(ptr_);
    }
    DeviceMemory(DeviceMemory&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    DeviceMemory& operator=(DeviceMemory&& o) noexcept {
        if (this != &o) {
            if (ptr_) cudaFree(ptr_);
            ptr_ = std::exchange(o.ptr_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    DeviceMemory(const DeviceMemory&) = delete;
    DeviceMemory& operator=(const DeviceMemory&) = delete;

    void* get() const { return ptr_; }
    template <class T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }
    std::size_t bytes() const { return bytes_; }
    // Every byte set to `value` (0xFF makes every fp32/bf16 element a NaN: unwritten outputs show).
    void fill_bytes(int value) const {
        if (bytes_ > 0) CUDA_CHECK(cudaMemset(ptr_, value, bytes_));
    }

private:
    void* ptr_ = nullptr;
    std::size_t bytes_ = 0;
};

// ---- host-side bf16 ----
inline std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
    std::vector<uint16_t> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = float_to_bf16(x[i]);
    return y;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& x) {
    std::vector<float> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_float(x[i]);
    return y;
}
// The values a bf16 tensor can hold: what the reference must be fed when the GPU input is bf16.
inline std::vector<float> round_bf16(const std::vector<float>& x) { return from_bf16(to_bf16(x)); }

// ---- transfers (synchronous) ----
template <class T>
DeviceMemory to_device(const std::vector<T>& host) {
    DeviceMemory d(host.size() * sizeof(T));
    if (!host.empty()) CUDA_CHECK(cudaMemcpy(d.get(), host.data(), d.bytes(), cudaMemcpyHostToDevice));
    return d;
}
template <class T>
std::vector<T> to_host(const void* device, std::size_t count) {
    std::vector<T> host(count);
    if (count > 0) CUDA_CHECK(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
}
// fp32 values uploaded as `dtype` (F32 or BF16; bf16 rounds to nearest even).
inline DeviceMemory upload_as(DType dtype, const std::vector<float>& host) {
    if (dtype == DType::BF16) return to_device(to_bf16(host));
    QT_CHECK(dtype == DType::F32, "upload_as: unsupported dtype ", dtype_name(dtype));
    return to_device(host);
}
// `count` elements of `dtype` (F32 or BF16) read back as fp32.
inline std::vector<float> download_as(DType dtype, const void* device, std::size_t count) {
    if (dtype == DType::BF16) return from_bf16(to_host<uint16_t>(device, count));
    QT_CHECK(dtype == DType::F32, "download_as: unsupported dtype ", dtype_name(dtype));
    return to_host<float>(device, count);
}

// Waits for the device and surfaces any asynchronous kernel error as a qtrain::Error.
inline void sync_device() {
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- comparison ----
struct Comparison {
    double max_abs_err = 0.0;  // max |actual - expected| (inf if actual has a non-finite value)
    double max_abs_ref = 0.0;  // max |expected|
    double rel_err = 0.0;      // max_abs_err / max_abs_ref (max_abs_err when the reference is all zero)
    double cosine = 1.0;       // cosine similarity (1 when either side is all zero)
    std::size_t worst = 0;     // index of the largest error (first non-finite one if any)
    std::size_t non_finite = 0;
};

inline Comparison compare(const std::vector<float>& actual, const std::vector<float>& expected) {
    Comparison c;
    double dot = 0.0, na = 0.0, ne = 0.0;
    const std::size_t n = std::min(actual.size(), expected.size());
    for (std::size_t i = 0; i < n; ++i) {
        const double a = actual[i], e = expected[i];
        c.max_abs_ref = std::max(c.max_abs_ref, std::abs(e));
        if (!std::isfinite(a)) {
            if (c.non_finite++ == 0) c.worst = i;
            c.max_abs_err = std::numeric_limits<double>::infinity();
            continue;
        }
        const double err = std::abs(a - e);
        if (c.non_finite == 0 && err > c.max_abs_err) {
            c.max_abs_err = err;
            c.worst = i;
        }
        dot += a * e;
        na += a * a;
        ne += e * e;
    }
    c.rel_err = c.max_abs_ref > 0.0 ? c.max_abs_err / c.max_abs_ref : c.max_abs_err;
    if (na > 0.0 && ne > 0.0) c.cosine = dot / std::sqrt(na * ne);
    if (c.non_finite > 0) c.cosine = 0.0;
    return c;
}

// Passes when max|a - e| <= rtol * max|e| + atol, the sizes match, nothing is NaN/inf, and (if
// min_cosine > 0) the cosine similarity is at least min_cosine. On failure the message names the
// worst element through `describe(index)` (e.g. "b=1 t=17 h=3 d=5").
inline ::testing::AssertionResult AllClose(const std::string& what, const std::vector<float>& actual,
                                           const std::vector<float>& expected, double rtol, double atol,
                                           double min_cosine = 0.0,
                                           const std::function<std::string(std::size_t)>& describe = nullptr) {
    if (actual.size() != expected.size())
        return ::testing::AssertionFailure()
               << what << ": size " << actual.size() << " != expected size " << expected.size();
    const Comparison c = compare(actual, expected);
    const bool ok = c.non_finite == 0 && c.max_abs_err <= rtol * c.max_abs_ref + atol && c.cosine >= min_cosine;
    std::ostringstream msg;
    msg.precision(9);
    msg << what << ": max abs err " << c.max_abs_err << " (rel " << c.rel_err << " vs rtol " << rtol << ", atol "
        << atol << "), max |ref| " << c.max_abs_ref << ", cosine " << c.cosine;
    if (min_cosine > 0.0) msg << " (min " << min_cosine << ")";
    if (c.non_finite > 0) msg << ", " << c.non_finite << " non-finite values";
    if (!actual.empty()) {
        msg << "; worst at [" << c.worst << "]";
        if (describe) msg << " (" << describe(c.worst) << ")";
        msg << ": actual " << actual[c.worst] << " expected " << expected[c.worst];
    }
    if (ok) return ::testing::AssertionSuccess() << msg.str();
    return ::testing::AssertionFailure() << msg.str();
}

}  // namespace qtrain::test
