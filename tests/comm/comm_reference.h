// What every communicator test compares against, shared by the threads tests (gtest) and the mpirun
// program (tests/comm/mpirun/mpi_check.cpp): each rank's data is a function of (seed, rank), so any
// rank — any process — can build the whole world's data and the sequential reference itself.
//
// The data mixes magnitudes (2^-20 .. 2^20, both signs), so a sum in another order than 0..N-1, or of
// the wrong blocks, or with another rounding, changes bits; order_sensitive() checks that it does.
// The reference sums are written out plainly here, not through src/comm/rank_order_sum.h, so a bug
// there cannot hide in both.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"

namespace qtrain::test {

inline std::vector<float> rank_data(uint64_t seed, int rank, std::size_t count) {
    Rng rng(seed * 1000003u + static_cast<uint64_t>(rank) * 7919u + 1);
    std::vector<float> v(count);
    for (auto& x : v) {
        const int exponent = static_cast<int>(rng.below(41)) - 20;
        x = std::ldexp(rng.normal(), exponent);
    }
    return v;
}

// (Not named to_bf16: tests/gpu/gpu_test_util.h has that one, and the GPU comm tests include both.)
inline std::vector<uint16_t> as_bf16(const std::vector<float>& v) {
    std::vector<uint16_t> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
    return out;
}

// Rank q's bytes for the data-moving collectives (all_gather, broadcast), any dtype.
inline std::vector<unsigned char> rank_bytes(uint64_t seed, int rank, std::size_t bytes) {
    Rng rng(seed * 1000033u + static_cast<uint64_t>(rank) * 104729u + 7);
    std::vector<unsigned char> v(bytes);
    for (auto& b : v) b = static_cast<unsigned char>(rng.next_u64() >> 56);
    return v;
}

// All ranks' data: data[q] = rank_data(seed, q, count).
inline std::vector<std::vector<float>> world_data(uint64_t seed, int world, std::size_t count) {
    std::vector<std::vector<float>> data;
    for (int q = 0; q < world; ++q) data.push_back(rank_data(seed, q, count));
    return data;
}

// sum over q = 0..N-1 (in that order, fp32) of data[q][offset + i], i < count.
inline std::vector<float> reference_sum_f32(const std::vector<std::vector<float>>& data, std::size_t offset,
                                            std::size_t count) {
    std::vector<float> out(count);
    for (std::size_t i = 0; i < count; ++i) {
        float acc = data[0][offset + i];
        for (std::size_t q = 1; q < data.size(); ++q) acc += data[q][offset + i];
        out[i] = acc;
    }
    return out;
}

// The same over the bf16-rounded data, rounded once to bf16 at the end.
inline std::vector<uint16_t> reference_sum_bf16(const std::vector<std::vector<float>>& data, std::size_t offset,
                                                std::size_t count) {
    std::vector<uint16_t> out(count);
    for (std::size_t i = 0; i < count; ++i) {
        float acc = bf16_to_float(float_to_bf16(data[0][offset + i]));
        for (std::size_t q = 1; q < data.size(); ++q) acc += bf16_to_float(float_to_bf16(data[q][offset + i]));
        out[i] = float_to_bf16(acc);
    }
    return out;
}

// Number of elements whose fp32 sum in reverse rank order differs from the sum in rank order: the
// tests require it to be > 0 for 3+ ranks, so they would catch a backend that sums in another order.
// (With 2 ranks, a + b == b + a exactly: there only the blocks and the rounding can be wrong.)
inline std::size_t order_sensitive(const std::vector<std::vector<float>>& data) {
    std::size_t differ = 0;
    const std::size_t count = data[0].size();
    for (std::size_t i = 0; i < count; ++i) {
        float forward = data[0][i], backward = data.back()[i];
        for (std::size_t q = 1; q < data.size(); ++q) forward += data[q][i];
        for (std::size_t q = data.size() - 1; q-- > 0;) backward += data[q][i];
        differ += std::memcmp(&forward, &backward, sizeof(float)) != 0;
    }
    return differ;
}

// "" when a and b (count elements of `bytes_each` bytes) are the same bits, else where they differ.
inline std::string first_difference(const void* a, const void* b, std::size_t count, std::size_t bytes_each) {
    const auto* x = static_cast<const unsigned char*>(a);
    const auto* y = static_cast<const unsigned char*>(b);
    std::size_t differ = 0, first = 0;
    for (std::size_t i = 0; i < count; ++i)
        if (std::memcmp(x + i * bytes_each, y + i * bytes_each, bytes_each) != 0 && differ++ == 0) first = i;
    if (!differ) return "";
    return std::to_string(differ) + " of " + std::to_string(count) + " elements differ, the first at " +
           std::to_string(first);
}

}  // namespace qtrain::test
