// Helpers shared by the GPU tests: skip cleanly without a GPU, an owning device buffer, moving host
// vectors to and from the device (converting through bf16 on the host with the reference conversions
// of core/dtype.h), the dtype-parameterised kernel test base, and metrics comparing a GPU result with
// the CPU reference. (The model tests' configs and batches: gpu_model_fixture.h.) The generic helpers
// (random_vector, EXPECT_ERROR, TempDir, ...) come from tests/test_util.h.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "test_util.h"

namespace qtrain::test {

inline bool has_gpu() { return cuda_device_count() > 0; }

}  // namespace qtrain::test

// First statement of every GPU test (or of its fixture's SetUp): skips (not fails) where no CUDA
// device is visible (CI).
#define QTRAIN_REQUIRE_GPU()                                                     \
    do {                                                                         \
        if (!::qtrain::test::has_gpu()) GTEST_SKIP() << "no CUDA device found";  \
    } while (0)

namespace qtrain::test {

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
std::vector<T> to_host(const void* device, std::size_t count) {
    std::vector<T> host(count);
    if (count > 0) CUDA_CHECK(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
}
// `count` elements of `dtype` (F32 or BF16) read back as fp32.
inline std::vector<float> download_as(DType dtype, const void* device, std::size_t count) {
    if (dtype == DType::BF16) return from_bf16(to_host<uint16_t>(device, count));
    QT_CHECK(dtype == DType::F32, "download_as: unsupported dtype ", dtype_name(dtype));
    return to_host<float>(device, count);
}

// An owning device allocation (nothing is allocated for 0 bytes; get() is then null).
//  - raw: DeviceBuffer(bytes), uninitialised; typed access through as<T>() / f32().
//  - typed: DeviceBuffer(n, dtype), n zeroed elements; DeviceBuffer(host, dtype), the fp32 host
//    values stored as dtype. A typed F32 or BF16 buffer also upload()s / download()s whole fp32
//    host vectors (bf16 rounds to nearest even on the way in).
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
        if (bytes_ > 0) CUDA_CHECK(cudaMalloc(&ptr_, bytes_));
    }
    DeviceBuffer(std::size_t n, DType dtype) : DeviceBuffer(n * dtype_size(dtype)) {
        dtype_ = dtype;
        size_ = n;
        fill_bytes(0);
    }
    DeviceBuffer(const std::vector<float>& host, DType dtype) : DeviceBuffer(host.size(), dtype) { upload(host); }
    ~DeviceBuffer() {
        if (ptr_) cudaFree(ptr_);
    }
    DeviceBuffer(DeviceBuffer&& o) noexcept
        : ptr_(std::exchange(o.ptr_, nullptr)),
          bytes_(std::exchange(o.bytes_, 0)),
          size_(std::exchange(o.size_, 0)),
          dtype_(o.dtype_) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            if (ptr_) cudaFree(ptr_);
            ptr_ = std::exchange(o.ptr_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
            size_ = std::exchange(o.size_, 0);
            dtype_ = o.dtype_;
        }
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void* get() const { return ptr_; }
    template <class T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }
    float* f32() const { return as<float>(); }
    std::size_t bytes() const { return bytes_; }
    std::size_t size() const { return size_; }  // elements of a typed buffer (0 for a raw one)
    DType dtype() const { return dtype_; }

    // Every byte set to `value` (0xFF makes every fp32/bf16 element a NaN: unwritten outputs show).
    void fill_bytes(int value) const {
        if (bytes_ > 0) CUDA_CHECK(cudaMemset(ptr_, value, bytes_));
    }
    // Typed buffers only: replaces the contents with `host` (size() values) converted to dtype().
    void upload(const std::vector<float>& host) {
        QT_CHECK(host.size() == size_, "DeviceBuffer::upload: ", host.size(), " values for ", size_, " elements");
        if (size_ == 0) return;
        if (dtype_ == DType::BF16) {
            const std::vector<uint16_t> raw = to_bf16(host);
            CUDA_CHECK(cudaMemcpy(ptr_, raw.data(), bytes_, cudaMemcpyHostToDevice));
        } else {
            QT_CHECK(dtype_ == DType::F32, "DeviceBuffer::upload: unsupported dtype ", dtype_name(dtype_));
            CUDA_CHECK(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice));
        }
    }
    // Typed buffers only: waits for the device, then reads the contents back as fp32.
    std::vector<float> download() const {
        CUDA_CHECK(cudaDeviceSynchronize());
        return download_as(dtype_, ptr_, size_);
    }

private:
    void* ptr_ = nullptr;
    std::size_t bytes_ = 0;
    std::size_t size_ = 0;
    DType dtype_ = DType::F32;
};

// A raw buffer holding a copy of `host`.
template <class T>
DeviceBuffer to_device(const std::vector<T>& host) {
    DeviceBuffer d(host.size() * sizeof(T));
    if (!host.empty()) CUDA_CHECK(cudaMemcpy(d.get(), host.data(), d.bytes(), cudaMemcpyHostToDevice));
    return d;
}

// Waits for the device and surfaces any asynchronous kernel error as a qtrain::Error.
inline void sync_device() {
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- parameterised kernel tests ----

// Base of a kernel test parameterised by the activation dtype (F32 or BF16): skips without a GPU.
class DtypeKernelTest : public ::testing::TestWithParam<DType> {
protected:
    void SetUp() override { QTRAIN_REQUIRE_GPU(); }
    DType act() const { return GetParam(); }
    // the tolerance for the current activation type
    double tol(double fp32, double bf16) const { return act() == DType::F32 ? fp32 : bf16; }
    // inputs as the GPU sees them
    std::vector<float> in(std::vector<float> v) const { return act() == DType::BF16 ? round_bf16(v) : v; }
};

// Columns [col, col + width) of every row of an [N, stride] matrix (e.g. the q or k heads of a fused
// qkv buffer), as an [N, width] matrix; paste() writes such a part back.
inline std::vector<float> cut(const std::vector<float>& m, int N, int stride, int col, int width) {
    std::vector<float> out(static_cast<std::size_t>(N) * width);
    for (int n = 0; n < N; ++n)
        std::copy_n(m.begin() + static_cast<std::size_t>(n) * stride + col, width,
                    out.begin() + static_cast<std::size_t>(n) * width);
    return out;
}
inline void paste(std::vector<float>& m, const std::vector<float>& part, int N, int stride, int col, int width) {
    for (int n = 0; n < N; ++n)
        std::copy_n(part.begin() + static_cast<std::size_t>(n) * width, width,
                    m.begin() + static_cast<std::size_t>(n) * stride + col);
}

// ---- comparison ----

// max |a - b| / max |b| (b the reference): one number per tensor, robust to tiny reference values.
// Any NaN/inf on either side (or a size mismatch) gives +inf, so such outputs always fail.
inline double rel_max_error(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    double diff = 0, ref = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        // a NaN or inf on either side is a failure, never skipped by max()
        if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
        diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
        ref = std::max(ref, std::fabs(static_cast<double>(b[i])));
    }
    return ref > 0 ? diff / ref : diff;
}

// Cosine similarity: 1 when both are all zero, NaN when only one is.
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

// The index of the first value whose bits differ between a and b (the shorter size when none does):
// the bit-identical mode tests report where two runs part.
inline std::size_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
    const std::size_t n = std::min(a.size(), b.size());
    for (std::size_t i = 0; i < n; ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
    return n;
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
