// Turns the runtime activation dtype into the kernel's element type.
#pragma once

#include <cuda_bf16.h>

#include "core/dtype.h"
#include "core/error.h"

#define QTRAIN_DISPATCH_ACT(dtype, T, ...)                                                         \
    do {                                                                                           \
        if ((dtype) == ::qtrain::DType::F32) {                                                     \
            using T = float;                                                                       \
            __VA_ARGS__;                                                                           \
        } else if ((dtype) == ::qtrain::DType::BF16) {                                             \
            using T = __nv_bfloat16;                                                               \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            ::qtrain::throw_error(::qtrain::cat("kernel: unsupported activation dtype ",          \
                                                ::qtrain::dtype_name(dtype)));                     \
        }                                                                                          \
    } while (0)
