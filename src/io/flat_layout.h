// A flat parameter space as checkpoints store it: each tensor (by its HF name) at an element offset,
// with padding between tensors that is zero and never trained. The GPU model's layout
// (model/cuda/gpu_layout.h, fused q|k|v and gate|up, 64-element alignment) is the one its block
// checkpoints use; model/checkpoint_layout.h turns it into this description. The description knows no
// backend, so CPU code and tests read GPU checkpoints with it (flat_state_reader.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qtrain {

struct FlatTensor {
    std::string name;
    int64_t offset = 0;  // first element in the flat space
    std::vector<int64_t> shape;
    int64_t numel() const {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        return n;
    }
};

struct FlatLayout {
    std::vector<FlatTensor> tensors;  // in offset order, not overlapping
    int64_t total = 0;                // elements, padding included

    // Throws naming `what` unless the tensors are in offset order, do not overlap and end by total.
    void check(const std::string& what) const;
    // 16 hex digits, XXH3-64 over every (name, offset, shape) and the total. Block files record it, so a
    // reader holding another layout (another model, backend or qtrain version) is refused instead of
    // reading elements at the wrong places.
    std::string fingerprint() const;
};

// The three arrays of a checkpoint over the flat space, and their names: the pieces of a block file
// are "<array>.<k>" (block_format.h), the named format has "<tensor>" (master, model.safetensors) and
// "<tensor>.exp_avg", "<tensor>.exp_avg_sq" (optimizer.safetensors).
enum class FlatArray { Master, ExpAvg, ExpAvgSq };
inline constexpr FlatArray kFlatArrays[3] = {FlatArray::Master, FlatArray::ExpAvg, FlatArray::ExpAvgSq};
const char* flat_array_name(FlatArray a);

}  // namespace qtrain
