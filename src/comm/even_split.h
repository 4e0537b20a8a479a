// How a backend divides `count` elements among `world` ranks when each rank computes a share of an
// all-reduce: contiguous blocks, the first count % world ranks one element longer. Only the work is
// divided this way; the result (each element summed in rank order) does not depend on the split.
#pragma once

#include <cstddef>

namespace qtrain::comm {

struct Share {
    std::size_t offset = 0;
    std::size_t count = 0;
};

inline Share even_split(std::size_t count, int world, int rank) {
    const std::size_t w = static_cast<std::size_t>(world), r = static_cast<std::size_t>(rank);
    const std::size_t base = count / w, extra = count % w;
    return {r * base + (r < extra ? r : extra), base + (r < extra ? 1 : 0)};
}

}  // namespace qtrain::comm
