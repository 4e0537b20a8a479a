#include "comm/rank_order_sum.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/error.h"

namespace qtrain::comm {
namespace {

// Tiles of this many elements are summed into an fp32 scratch on the stack before anything is written
// to `out`: that makes out == a source safe, and the inner loops (one source over one tile) vectorise
// across elements without changing the per-element order of the additions.
constexpr std::size_t kTile = 2048;

void sum_f32(const void* const* sources, int n, std::size_t count, float* out) {
    float acc[kTile];
    for (std::size_t base = 0; base < count; base += kTile) {
        const std::size_t len = std::min(kTile, count - base);
        std::memcpy(acc, static_cast<const float*>(sources[0]) + base, len * sizeof(float));
        for (int q = 1; q < n; ++q) {
            const float* src = static_cast<const float*>(sources[q]) + base;
            for (std::size_t j = 0; j < len; ++j) acc[j] += src[j];
        }
        std::memcpy(out + base, acc, len * sizeof(float));
    }
}

void sum_bf16(const void* const* sources, int n, std::size_t count, uint16_t* out) {
    float acc[kTile];
    for (std::size_t base = 0; base < count; base += kTile) {
        const std::size_t len = std::min(kTile, count - base);
        const uint16_t* first = static_cast<const uint16_t*>(sources[0]) + base;
        for (std::size_t j = 0; j < len; ++j) acc[j] = bf16_to_float(first[j]);
        for (int q = 1; q < n; ++q) {
            const uint16_t* src = static_cast<const uint16_t*>(sources[q]) + base;
            for (std::size_t j = 0; j < len; ++j) acc[j] += bf16_to_float(src[j]);
        }
        for (std::size_t j = 0; j < len; ++j) out[base + j] = float_to_bf16(acc[j]);
    }
}

}  // namespace

void sum_in_rank_order(const void* const* sources, int n, std::size_t count, DType dtype, void* out) {
    QT_CHECK(n >= 1, "sum_in_rank_order: needs at least one source, got ", n);
    switch (dtype) {
        case DType::F32: return sum_f32(sources, n, count, static_cast<float*>(out));
        case DType::BF16: return sum_bf16(sources, n, count, static_cast<uint16_t*>(out));
        default: throw_error(cat("sum_in_rank_order: sums are implemented for fp32 and bf16, got ", dtype_name(dtype)));
    }
}

}  // namespace qtrain::comm
