// Memo of piece -> ids. Natural text repeats its words, so most pieces are looked up, not merged
// again. One cache per thread (no locks); it is cleared when it grows past its budget.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qtrain {

class PieceCache {
public:
    static constexpr std::size_t kMaxPieceBytes = 256;  // longer pieces rarely repeat: not kept

    // Appends the cached ids of `piece` to `out`; false when it is not cached.
    bool lookup(std::string_view piece, std::vector<int32_t>& out) const;
    void insert(std::string_view piece, const int32_t* ids, std::size_t n);
    void clear();
    std::size_t size() const { return count_; }

private:
    struct Entry {
        uint64_t hash = 0;  // 0: empty slot
        uint32_t key_offset = 0, ids_offset = 0;
        uint16_t key_size = 0, ids_size = 0;
    };
    const Entry* find(std::string_view piece, uint64_t hash) const;

    std::vector<Entry> table_;  // open addressing, power-of-two size
    std::string keys_;
    std::vector<int32_t> ids_;
    std::size_t count_ = 0;
};

}  // namespace qtrain
