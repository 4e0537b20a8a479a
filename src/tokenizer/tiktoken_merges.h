// The merges list of a HF tokenizer.json that encodes like a tiktoken rank file. tiktoken has no
// merges: it joins the adjacent pair whose concatenation has the lowest rank. A tokenizer.json
// lists one (left, right) pair per token instead, ranked by position. BPE over the ranks below a
// token's own reaches that token's bytes as exactly two parts (for a consistent rank file, such as
// Qwen's, every token of two or more bytes does); that last pair is the token's merge.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/bpe.h"

namespace qtrain {

struct RankMerge {
    int32_t left, right, result;
};

// One merge per token of two or more bytes, in rank (= id) order. Throws, naming `source`, for a
// token that BPE over the lower ranks does not reach (HF's BPE could never produce it).
std::vector<RankMerge> merges_from_ranks(const BpeModel& ranks, const std::string& source);

}  // namespace qtrain
