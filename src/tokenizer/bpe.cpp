#include "tokenizer/bpe.h"

#include <climits>
#include <cstring>
#include <queue>

#include "core/error.h"

namespace qtrain {
namespace {

constexpr std::size_t kShortLimit = 64;  // bytes; longer pieces use the heap loop

inline uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
}

inline std::size_t mix(uint64_t key) { return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> 17); }

}  // namespace

BpeModel::BpeModel(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {
    std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
    for (std::size_t id = 0; id < tokens_.size(); ++id) {
        if (tokens_[id].size() == 1) byte_ids_[static_cast<uint8_t>(tokens_[id][0])] = static_cast<int32_t>(id);
    }
    for (int b = 0; b < 256; ++b) {
        QT_CHECK(byte_ids_[b] >= 0, "tokenizer: byte 0x", std::hex, b,
                 " has no token (a byte-level BPE vocabulary must hold all 256 bytes)");
    }
    slots_.assign(1 << 16, Slot{kEmpty, 0, 0});
}

void BpeModel::grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.size() * 2, Slot{kEmpty, 0, 0});
    const std::size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
        if (s.key == kEmpty) continue;
        std::size_t i = mix(s.key) & mask;
        while (slots_[i].key != kEmpty) i = (i + 1) & mask;
        slots_[i] = s;
    }
}

void BpeModel::add_merge(int32_t left, int32_t right, int32_t rank, int32_t result) {
    if ((merge_count_ + 1) * 2 > slots_.size()) grow();  // load factor <= 1/2
    const uint64_t key = pair_key(left, right);
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = mix(key) & mask;
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask;
    if (slots_[i].key == key) {
        if (rank < slots_[i].rank) slots_[i] = Slot{key, rank, result};
        return;
    }
    slots_[i] = Slot{key, rank, result};
    ++merge_count_;
}

const BpeModel::Slot* BpeModel::find(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = mix(key) & mask;
    while (true) {
        const Slot& s = slots_[i];
        if (s.key == key) return &s;
        if (s.key == kEmpty) return nullptr;
        i = (i + 1) & mask;
    }
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.size() <= kShortLimit) {
        encode_short(piece, out);
    } else {
        encode_long(piece, out);
    }
}

// Short pieces: arrays of ids and of the rank of each adjacent pair; each step scans for the
// lowest rank (leftmost on ties) and recomputes only the two pairs the merge touched.
void BpeModel::encode_short(std::string_view piece, std::vector<int32_t>& out) const {
    const std::size_t n = piece.size();
    if (n == 0) return;
    int32_t stack_buf[3 * kShortLimit];
    std::vector<int32_t> heap_buf;
    if (n > kShortLimit) heap_buf.resize(3 * n);
    int32_t* ids = n > kShortLimit ? heap_buf.data() : stack_buf;
    int32_t* ranks = ids + n;
    int32_t* results = ranks + n;
    for (std::size_t i = 0; i < n; ++i) ids[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
    auto set_pair = [&](std::size_t i) {
        const Slot* s = find(ids[i], ids[i + 1]);
        ranks[i] = s ? s->rank : INT32_MAX;
        results[i] = s ? s->result : -1;
    };
    std::size_t m = n;
    for (std::size_t i = 0; i + 1 < m; ++i) set_pair(i);
    while (m > 1) {
        std::size_t best = 0;
        for (std::size_t i = 1; i + 1 < m; ++i) {
            if (ranks[i] < ranks[best]) best = i;
        }
        if (ranks[best] == INT32_MAX) break;
        ids[best] = results[best];
        const std::size_t tail = m - best - 2;  // elements after best + 1
        std::memmove(ids + best + 1, ids + best + 2, tail * sizeof(int32_t));
        std::memmove(ranks + best + 1, ranks + best + 2, tail * sizeof(int32_t));
        std::memmove(results + best + 1, results + best + 2, tail * sizeof(int32_t));
        --m;
        if (best > 0) set_pair(best - 1);
        if (best + 1 < m) set_pair(best);
    }
    out.insert(out.end(), ids, ids + m);
}

// Long pieces (e.g. a run of thousands of spaces): a doubly linked list of symbols and a min-heap
// of candidate merges keyed by (rank, position). Entries go stale when a neighbour merges; a
// popped entry is applied only if its pair still exists with the same rank and result.
void BpeModel::encode_long(std::string_view piece, std::vector<int32_t>& out) const {
    const int n = static_cast<int>(piece.size());
    if (n == 0) return;
    std::vector<int32_t> ids(n);
    std::vector<int> prev(n), next(n);
    std::vector<char> alive(n, 1);
    for (int i = 0; i < n; ++i) {
        ids[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
        prev[i] = i - 1;
        next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Candidate {
        int32_t rank;
        int pos;
        int32_t result;
        bool operator>(const Candidate& o) const {
            return rank != o.rank ? rank > o.rank : pos > o.pos;
        }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    auto push = [&](int i) {
        if (i < 0 || next[i] < 0) return;
        if (const Slot* s = find(ids[i], ids[next[i]])) heap.push({s->rank, i, s->result});
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
        const Candidate top = heap.top();
        heap.pop();
        if (!alive[top.pos] || next[top.pos] < 0) continue;
        const int right = next[top.pos];
        const Slot* s = find(ids[top.pos], ids[right]);
        if (!s || s->rank != top.rank || s->result != top.result) continue;
        ids[top.pos] = top.result;
        alive[right] = 0;
        next[top.pos] = next[right];
        if (next[right] >= 0) prev[next[right]] = top.pos;
        push(prev[top.pos]);
        push(top.pos);
    }
    for (int i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

}  // namespace qtrain
