// Which part of the flat parameter space a data-parallel rank owns (ZeRO-1/2): the contiguous block
// [begin, end) of `size` elements at rank * size. Every block has the same size (a multiple of 64, so
// each starts aligned for AdamW's vector loads and the collectives' blocks line up), so the flat
// buffers the collectives move (gradients, weights) are padded to world * size elements; the padding
// is zero and never updated. At world 1 the block is the whole space and nothing is padded (the
// layout's total is a multiple of 64), so the sharded path allocates what the plain one does.
#pragma once

#include <algorithm>
#include <cstdint>

namespace qtrain {

struct ParamShard {
    int rank = 0, world = 1;
    int64_t size = 0;          // elements per rank's block (padding included)
    int64_t begin = 0, end = 0;  // the rank's real elements, [begin, end) of the layout's total
    int64_t padded_total() const { return size * world; }
    int64_t count() const { return end - begin; }  // may be 0 for a tiny model on many ranks
};

inline ParamShard param_shard(int64_t total, int world, int rank) {
    ParamShard s;
    s.rank = rank;
    s.world = world;
    s.size = ((total + world - 1) / world + 63) / 64 * 64;
    s.begin = std::min<int64_t>(static_cast<int64_t>(rank) * s.size, total);
    s.end = std::min<int64_t>(s.begin + s.size, total);
    return s;
}

}  // namespace qtrain
