// Where the GPU backends put the pieces of a sum (src/comm/cuda/): the peers' blocks in the staging
// buffer, and the padded blocks of the NCCL all-reduce. Plain arithmetic, so the CPU tests check it.
#pragma once

#include <algorithm>
#include <cstddef>

#include "core/dtype.h"

namespace qtrain::comm {

// The peers' copies of one block of `count` elements, in the staging buffer of rank `rank`: the
// world - 1 other ranks in rank order (the rank's own block is read where it is), each slot `stride`
// elements after the previous one. The stride is count rounded up to 16 bytes, so every slot starts
// as aligned as the buffer (the sum kernel's vector loads need 16-byte alignment).
struct StagingLayout {
    std::size_t stride = 0;  // elements from one slot to the next
    std::size_t bytes = 0;   // the whole layout: (world - 1) * stride elements
};

inline StagingLayout staging_layout(std::size_t count, int world, DType dtype) {
    const std::size_t es = dtype_size(dtype);
    const std::size_t per16 = 16 / es;  // elements in 16 bytes (dtype sizes are 1, 2 or 4)
    StagingLayout l;
    l.stride = (count + per16 - 1) / per16 * per16;
    l.bytes = world > 1 ? static_cast<std::size_t>(world - 1) * l.stride * es : 0;
    return l;
}

// The slot of peer `peer` (!= rank) in rank `rank`'s staging: the ranks below it, then those above.
inline std::size_t staging_slot(int peer, int rank) {
    return static_cast<std::size_t>(peer < rank ? peer : peer - 1);
}

// The NCCL all-reduce's blocks: ncclAllGather gathers equal blocks, so `count` is cut into world
// blocks of ceil(count / world) elements, the last ones short or empty (count 7 over 3 ranks:
// 3, 3, 1; count 1 over 3: 1, 0, 0). Rank r sums block r; when count is not a multiple of the world,
// the full padded blocks are gathered in staging and the first `count` elements copied out.
struct PaddedBlocks {
    std::size_t count = 0;
    std::size_t block = 0;  // elements per block (0 only when count is 0)

    std::size_t offset(int rank) const { return static_cast<std::size_t>(rank) * block; }
    // The elements of block `rank` that lie inside count (the rest is padding).
    std::size_t length(int rank) const {
        const std::size_t start = offset(rank);
        return start >= count ? 0 : std::min(block, count - start);
    }
    bool padded(int world) const { return block * static_cast<std::size_t>(world) != count; }
};

inline PaddedBlocks padded_blocks(std::size_t count, int world) {
    const std::size_t w = static_cast<std::size_t>(world);
    return {count, (count + w - 1) / w};
}

}  // namespace qtrain::comm
