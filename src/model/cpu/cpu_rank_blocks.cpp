#include "model/cpu/cpu_rank_blocks.h"

#include <algorithm>

namespace qtrain::cpu {

RankBlock rank_block(int64_t total, int world, int rank) {
    RankBlock b;
    b.size = (total + world - 1) / world;
    b.begin = std::min<int64_t>(rank * b.size, total);
    b.end = std::min<int64_t>(b.begin + b.size, total);
    return b;
}

const float* sum_block_over_ranks(comm::Communicator& c, int zero_level, const RankBlock& b,
                                  const std::vector<float>& grads, BlockScratch& s) {
    const int W = c.world(), r = c.rank();
    s.padded.assign(static_cast<size_t>(b.size) * W, 0.0f);
    s.block.assign(static_cast<size_t>(b.size), 0.0f);
    std::copy(grads.begin(), grads.end(), s.padded.begin());
    if (zero_level == 1) {  // the whole sum on every rank, of which the block is read
        c.all_reduce(s.padded.data(), s.padded.data(), s.padded.size(), DType::F32);
        return s.padded.data() + r * b.size;
    }
    c.reduce_scatter(s.padded.data(), s.block.data(), static_cast<size_t>(b.size), DType::F32);
    return s.block.data();
}

double sum_over_ranks(comm::Communicator& c, double x) {
    double sum = 0.0;
    comm::sum_scalars_over_ranks(c, &x, &sum, 1);
    return sum;
}

void all_gather_blocks(comm::Communicator& c, const RankBlock& b, std::vector<float>& state, BlockScratch& s) {
    const int W = c.world();
    s.padded.resize(static_cast<size_t>(b.size) * W);
    s.block.assign(static_cast<size_t>(b.size), 0.0f);
    std::copy(state.begin() + b.begin, state.begin() + b.end, s.block.begin());
    c.all_gather(s.block.data(), s.padded.data(), static_cast<size_t>(b.size), DType::F32);
    std::copy(s.padded.begin(), s.padded.begin() + static_cast<int64_t>(state.size()), state.begin());
}

}  // namespace qtrain::cpu
