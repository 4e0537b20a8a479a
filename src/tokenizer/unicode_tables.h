// The Unicode data the tokenizer needs, as HF `tokenizers` sees it (generated into
// unicode_tables.cpp by scripts/tokenizer_unicode_tables.py, which explains why the data is
// probed from the reference encoder rather than taken from one Unicode version).
#pragma once

#include <cstdint>

namespace qtrain::unicode {

// Property bits of a code point.
enum : uint8_t {
    kLetter = 1,       // \p{L} in the pre-tokenizer regex
    kNumber = 2,       // \p{N}
    kSpace = 4,        // \s
    kNfcBoundary = 8,  // combining class 0, NFC-stable, never the second half of a composition:
                       // NFC can restart before this character
};

struct CombiningClass {
    char32_t cp;
    uint8_t ccc;
};
struct Decomposition {
    char32_t cp;
    uint16_t offset;  // into kDecompositionPool
    uint8_t size;
};
struct Composition {
    char32_t first, second, composite;
};

extern const uint16_t kPropertyIndex[0x1100];  // cp >> 8 -> block in kPropertyBlocks
extern const uint8_t kPropertyBlocks[];
extern const CombiningClass kCombiningClasses[];  // sorted by cp
extern const int kNumCombiningClasses;
extern const char32_t kDecompositionPool[];
extern const Decomposition kDecompositions[];  // sorted by cp; full canonical, Hangul excluded
extern const int kNumDecompositions;
extern const Composition kCompositions[];  // sorted by (first, second); Hangul excluded
extern const int kNumCompositions;

inline uint8_t properties(char32_t cp) {
    if (cp >= 0x110000) return 0;
    return kPropertyBlocks[static_cast<uint32_t>(kPropertyIndex[cp >> 8]) * 256 + (cp & 255)];
}

// Canonical combining class (0 for starters and for code points the reference does not know).
uint8_t combining_class(char32_t cp);
// Full canonical decomposition of `cp` (Hangul included) written to out[0..n); returns n, or 0 when
// `cp` does not decompose. `out` must hold at least 4 code points.
int decompose(char32_t cp, char32_t* out);
// The primary composite of (first, second), Hangul included, or 0 when they do not compose.
char32_t compose(char32_t first, char32_t second);

}  // namespace qtrain::unicode
