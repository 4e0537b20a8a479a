// Scratch space of the calling thread for Tokenizer's encoders (tokenizer.cpp, token_offsets.cpp),
// reused across calls: the piece cache and the pieces of the text being encoded.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/piece_cache.h"

namespace qtrain {

struct EncodeContext {
    uint64_t owner = 0;  // the Tokenizer whose pieces the cache holds
    PieceCache cache;
    std::vector<std::string_view> pieces;
};

}  // namespace qtrain
