// A non-owning view of a typed, contiguous, row-major array on the host or a GPU. Kernels take raw
// pointers and sizes; this view is the typed layer one step above them (as in llm.q).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace qtrain {

enum class Device : uint8_t { CPU, CUDA };

struct Tensor {
    static constexpr int kMaxDims = 4;

    void* data = nullptr;
    DType dtype = DType::F32;
    Device device = Device::CPU;
    int ndim = 0;
    std::array<int64_t, kMaxDims> shape{};

    Tensor() = default;
    Tensor(void* data_, DType dtype_, std::initializer_list<int64_t> dims, Device device_ = Device::CPU)
        : data(data_), dtype(dtype_), device(device_) {
        QT_CHECK(dims.size() <= kMaxDims, "Tensor: at most ", kMaxDims, " dimensions, got ", dims.size());
        for (int64_t d : dims) shape[ndim++] = d;
    }

    int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < ndim; ++i) n *= shape[i];
        return n;
    }
    std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
    int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }

    template <class T>
    T* as() const { return static_cast<T*>(data); }

    std::string shape_str() const {
        std::string s = "[";
        for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
        return s + "]";
    }
};

}  // namespace qtrain
