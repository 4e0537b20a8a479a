#include "tokenizer/piece_cache.h"

#include <cstring>

namespace qtrain {
namespace {

constexpr std::size_t kMaxKeyBytes = 16u << 20;  // budget before clearing (about 50 MB in all)
constexpr std::size_t kInitialSlots = 1 << 16;

// A quick 64-bit string hash (8 bytes per step, multiply-xorshift mixing); never returns 0.
uint64_t hash_bytes(std::string_view s) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xC2B2AE3D27D4EB4Full);
    std::size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
        uint64_t w;
        std::memcpy(&w, s.data() + i, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    uint64_t tail = 0;
    std::memcpy(&tail, s.data() + i, s.size() - i);
    h = (h ^ tail) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    return h | 1;
}

}  // namespace

const PieceCache::Entry* PieceCache::find(std::string_view piece, uint64_t hash) const {
    if (table_.empty()) return nullptr;
    const std::size_t mask = table_.size() - 1;
    for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
        const Entry& e = table_[i];
        if (e.hash == 0) return &e;
        if (e.hash == hash && e.key_size == piece.size() &&
            std::memcmp(keys_.data() + e.key_offset, piece.data(), piece.size()) == 0) {
            return &e;
        }
    }
}

bool PieceCache::lookup(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.size() > kMaxPieceBytes) return false;
    const Entry* e = find(piece, hash_bytes(piece));
    if (!e || e->hash == 0) return false;
    out.insert(out.end(), ids_.data() + e->ids_offset, ids_.data() + e->ids_offset + e->ids_size);
    return true;
}

void PieceCache::insert(std::string_view piece, const int32_t* ids, std::size_t n) {
    if (piece.size() > kMaxPieceBytes) return;
    if (keys_.size() + piece.size() > kMaxKeyBytes) clear();
    if (table_.empty() || (count_ + 1) * 2 > table_.size()) {  // keep load <= 1/2
        std::vector<Entry> old = std::move(table_);
        table_.assign(old.empty() ? kInitialSlots : old.size() * 2, Entry{});
        const std::size_t mask = table_.size() - 1;
        for (const Entry& e : old) {
            if (e.hash == 0) continue;
            std::size_t i = e.hash & mask;
            while (table_[i].hash != 0) i = (i + 1) & mask;
            table_[i] = e;
        }
    }
    const uint64_t hash = hash_bytes(piece);
    Entry* slot = const_cast<Entry*>(find(piece, hash));
    if (slot->hash != 0) return;  // already cached
    slot->hash = hash;
    slot->key_offset = static_cast<uint32_t>(keys_.size());
    slot->key_size = static_cast<uint16_t>(piece.size());
    slot->ids_offset = static_cast<uint32_t>(ids_.size());
    slot->ids_size = static_cast<uint16_t>(n);
    keys_.append(piece);
    ids_.insert(ids_.end(), ids, ids + n);
    ++count_;
}

void PieceCache::clear() {
    table_.clear();
    keys_.clear();
    ids_.clear();
    count_ = 0;
}

}  // namespace qtrain
