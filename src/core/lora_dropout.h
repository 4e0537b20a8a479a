// LoRA dropout's mask (issue 33, model/lora.h), one definition for the CPU reference model and the
// GPU kernels, so both drop the same elements bit for bit. Pass c (training passes since the adapters
// started), layer l and target t give a stream (slot = l * 7 + t); element i of the adapter's input
// [N, in] (row-major) draws the i-th uniform of that stream. The stream is core/rng.h's splitmix64
// Rng, whose i-th draw depends only on its start and i, so a kernel computes any element directly.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define QT_LORA_HD __host__ __device__ __forceinline__
#else
#define QT_LORA_HD inline
#endif

namespace qtrain {

QT_LORA_HD uint64_t lora_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The Rng state the mask of (pass, slot) starts from (what CpuLora seeded its Rng with).
QT_LORA_HD uint64_t lora_dropout_stream(uint64_t seed, uint64_t pass, uint64_t slot) {
    constexpr uint64_t golden = 0x9e3779b97f4a7c15ull;
    uint64_t state = seed ^ 0x6c6f7261ull;  // "lora": apart from the init's streams
    state += golden;
    state ^= lora_mix64(state) + pass;
    state += golden;
    state ^= lora_mix64(state) + slot;
    return lora_mix64(state + golden);
}

// Element i's multiplier: 0 (dropped, with probability p) or keep = 1 / (1 - p), as torch's Dropout.
QT_LORA_HD float lora_dropout_scale(uint64_t stream, uint64_t i, float p, float keep) {
    const uint64_t z = lora_mix64(stream + (i + 1) * 0x9e3779b97f4a7c15ull);
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    return u < p ? 0.0f : keep;
}

}  // namespace qtrain
