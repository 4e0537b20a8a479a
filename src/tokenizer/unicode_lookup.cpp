// Lookups over the generated tables. Only the NFC slow path calls these (text that has combining
// marks or decomposable characters), so plain binary search over sorted arrays is enough.
#include <algorithm>

#include "tokenizer/unicode_tables.h"

namespace qtrain::unicode {
namespace {

// Hangul syllables decompose and compose by arithmetic (Unicode chapter 3.12), not by table.
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
              kSCount = kLCount * kNCount;

}  // namespace

uint8_t combining_class(char32_t cp) {
    const CombiningClass* end = kCombiningClasses + kNumCombiningClasses;
    const CombiningClass* it = std::lower_bound(
        kCombiningClasses, end, cp, [](const CombiningClass& e, char32_t c) { return e.cp < c; });
    return it != end && it->cp == cp ? it->ccc : 0;
}

int decompose(char32_t cp, char32_t* out) {
    if (cp >= kSBase && cp < kSBase + kSCount) {
        const int s = static_cast<int>(cp - kSBase);
        out[0] = kLBase + s / kNCount;
        out[1] = kVBase + (s % kNCount) / kTCount;
        if (s % kTCount == 0) return 2;
        out[2] = kTBase + s % kTCount;
        return 3;
    }
    const Decomposition* end = kDecompositions + kNumDecompositions;
    const Decomposition* it = std::lower_bound(
        kDecompositions, end, cp, [](const Decomposition& e, char32_t c) { return e.cp < c; });
    if (it == end || it->cp != cp) return 0;
    std::copy_n(kDecompositionPool + it->offset, it->size, out);
    return it->size;
}

char32_t compose(char32_t first, char32_t second) {
    if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
        second < kVBase + kVCount) {
        return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
    }
    if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
        second > kTBase && second < kTBase + kTCount) {
        return first + (second - kTBase);
    }
    const Composition* end = kCompositions + kNumCompositions;
    const Composition* it =
        std::lower_bound(kCompositions, end, std::make_pair(first, second),
                         [](const Composition& e, const std::pair<char32_t, char32_t>& key) {
                             return e.first != key.first ? e.first < key.first
                                                         : e.second < key.second;
                         });
    return it != end && it->first == first && it->second == second ? it->composite : 0;
}

}  // namespace qtrain::unicode
