// Random operands for the GPU benchmarks: a GEMM's or a memory-bound kernel's power (and so its clock
// under the H200's 700 W cap) depends on how many bits its data toggles (perf-notes session 26), so the
// benches time random values, not constants.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "bench_check.h"

// `n` bytes of bf16 values ~ N(0, sigma^2) (read as e4m3 or e5m2 bytes: random codes, the NaN/inf ones
// moved to finite neighbours; as fp32: about the same values), tiled from one 32 MiB host block per sigma.
inline void fill_random(void* dev, std::size_t n, float sigma = 0.1f) {
    static std::map<float, std::vector<uint16_t>> blocks;
    std::vector<uint16_t>& block = blocks[sigma];
    if (block.empty()) {
        block.resize(std::size_t{16} << 20);  // 32 MiB
        std::mt19937 rng(2026);
        std::normal_distribution<float> normal(0.0f, sigma);
        for (uint16_t& v : block) {
            const float f = normal(rng);
            uint32_t bits;
            std::memcpy(&bits, &f, 4);
            v = static_cast<uint16_t>(bits >> 16);
            if ((v & 0x7c) == 0x7c) v &= ~uint16_t{0x40};   // low byte: no e5m2 inf/NaN (and so no e4m3 NaN)
            if (((v >> 8) & 0x7c) == 0x7c) v &= ~uint16_t{0x4000};  // high byte likewise (never, at N(0, 0.1))
        }
    }
    const std::size_t bb = block.size() * 2;
    for (std::size_t at = 0; at < n; at += bb)
        CK(cudaMemcpy(static_cast<char*>(dev) + at, block.data(), std::min(bb, n - at), cudaMemcpyHostToDevice));
}
