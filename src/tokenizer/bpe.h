// Byte-level BPE over raw bytes: token ids <-> byte strings and the merge table. Both source
// formats reduce to the same rule: repeatedly merge the adjacent pair with the lowest rank, the
// leftmost one on ties. tokenizer.json ranks a pair by its position in model.merges; a tiktoken
// file ranks it by the rank of the merged bytes (its token id), so every split of a token into two
// tokens is a merge of that rank.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qtrain {

class BpeModel {
public:
    // `tokens[id]` = the bytes of token `id`; every single byte must be a token.
    explicit BpeModel(std::vector<std::string> tokens);

    // Adds the merge (left, right) -> result with the given rank (lower merges first). A pair given
    // twice keeps its lowest rank.
    void add_merge(int32_t left, int32_t right, int32_t rank, int32_t result);

    int size() const { return static_cast<int>(tokens_.size()); }
    const std::string& token(int32_t id) const { return tokens_[id]; }
    int32_t byte_token(uint8_t b) const { return byte_ids_[b]; }
    std::size_t num_merges() const { return merge_count_; }

    // Appends the ids of one pre-tokenized piece (any bytes) to `out`.
    void encode(std::string_view piece, std::vector<int32_t>& out) const;

    // The two merge loops, exposed so a test can check they agree; encode() picks by length.
    void encode_short(std::string_view piece, std::vector<int32_t>& out) const;
    void encode_long(std::string_view piece, std::vector<int32_t>& out) const;

private:
    struct Slot {
        uint64_t key;  // (left << 32) | right; kEmpty when free
        int32_t rank;
        int32_t result;
    };
    static constexpr uint64_t kEmpty = ~0ull;

    // Rank and result of merging (left, right); rank = INT32_MAX when they do not merge.
    const Slot* find(int32_t left, int32_t right) const;
    void grow();

    std::vector<std::string> tokens_;
    int32_t byte_ids_[256];
    std::vector<Slot> slots_;  // open addressing, linear probing, power-of-two size
    std::size_t merge_count_ = 0;
};

}  // namespace qtrain
