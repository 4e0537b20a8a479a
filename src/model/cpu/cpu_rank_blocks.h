// The CPU model's ZeRO blocks over data-parallel ranks (cpu_data_parallel.cpp): what the full model's
// step and LoRA's adapters' step share. A flat space of P elements is split into W blocks of
// S = ceil(P / W) (the last ones shorter or empty); rank r owns [r S, min((r + 1) S, P)). Every sum
// goes over the ranks in rank order (comm/communicator.h), so the all-reduce of ZeRO-1 and the
// reduce-scatter of ZeRO-2/3 give the rank's block the same bits, and so does the norm below.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace qtrain::cpu {

struct RankBlock {
    int64_t size = 0;            // S: elements per rank (the last blocks padded to it)
    int64_t begin = 0, end = 0;  // this rank's real elements
};
RankBlock rank_block(int64_t total, int world, int rank);

// Scratch the collectives move: the padded whole (W x S) and one block (S).
struct BlockScratch {
    std::vector<float> padded, block;
};

// This rank's block of `grads` (P elements) summed over the ranks: ZeRO-1 all-reduces the whole,
// ZeRO-2 and 3 reduce-scatter. The pointer is into `s`; element 0 is the block's first.
const float* sum_block_over_ranks(comm::Communicator& c, int zero_level, const RankBlock& b,
                                  const std::vector<float>& grads, BlockScratch& s);

// x summed over the ranks in rank order, as a double (every rank gets the same bits).
double sum_over_ranks(comm::Communicator& c, double x);

// Every rank's block of `state` (P elements, this rank's block [begin, end) up to date) from its
// owner: afterwards every rank holds the same whole state.
void all_gather_blocks(comm::Communicator& c, const RankBlock& b, std::vector<float>& state, BlockScratch& s);

}  // namespace qtrain::cpu
