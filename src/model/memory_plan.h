// What a model will allocate, by category, before it allocates anything (docs/design.md, "Memory").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qtrain {

struct MemoryPlan {
    struct Entry {
        std::string category;     // Weights, Master, Gradients, Adam M, Adam V, Activations, ...
        uint64_t device_bytes = 0;  // on the GPU (or in host RAM for the CPU model)
        uint64_t pinned_bytes = 0;  // pinned host memory (offload)
    };
    std::string device;  // "cpu" or the GPU name
    std::vector<Entry> entries;

    void add(const std::string& category, uint64_t device_bytes, uint64_t pinned_bytes = 0) {
        entries.push_back({category, device_bytes, pinned_bytes});
    }
    uint64_t total_device() const {
        uint64_t t = 0;
        for (const auto& e : entries) t += e.device_bytes;
        return t;
    }
    uint64_t total_pinned() const {
        uint64_t t = 0;
        for (const auto& e : entries) t += e.pinned_bytes;
        return t;
    }
};

}  // namespace qtrain
