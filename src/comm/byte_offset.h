// Element `elements` of a raw buffer of `dtype`: the byte arithmetic every backend's collectives do.
#pragma once

#include <cstddef>

#include "core/dtype.h"

namespace qtrain::comm {

inline const std::byte* at(const void* p, std::size_t elements, DType dtype) {
    return static_cast<const std::byte*>(p) + elements * dtype_size(dtype);
}
inline std::byte* at(void* p, std::size_t elements, DType dtype) {
    return static_cast<std::byte*>(p) + elements * dtype_size(dtype);
}

}  // namespace qtrain::comm
