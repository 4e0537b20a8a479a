// UTF-8 helpers for the tokenizer. Text reaches the tokenizer as bytes; invalid UTF-8 is repaired
// first, the way Python's bytes.decode("utf-8", errors="replace") does it (each maximal ill-formed
// subsequence becomes one U+FFFD, the Unicode "best practice"), so that a Python pipeline that reads
// files with errors="replace" and HF `tokenizers` give the same ids as qtrain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qtrain::utf8 {

// Length of the valid UTF-8 prefix of `text` (== text.size() when all of it is valid).
std::size_t valid_prefix(std::string_view text);

// Appends `text` to `out` with every maximal ill-formed subsequence replaced by U+FFFD; returns the
// number of replacements.
std::size_t append_repaired(std::string_view text, std::string& out);

// Decodes the code point at p (which must be valid UTF-8); sets `len` to its byte length.
inline char32_t decode(const char* p, int& len) {
    const auto b0 = static_cast<unsigned char>(p[0]);
    if (b0 < 0x80) {
        len = 1;
        return b0;
    }
    const auto b1 = static_cast<unsigned char>(p[1]) & 0x3Fu;
    if (b0 < 0xE0) {
        len = 2;
        return ((b0 & 0x1Fu) << 6) | b1;
    }
    const auto b2 = static_cast<unsigned char>(p[2]) & 0x3Fu;
    if (b0 < 0xF0) {
        len = 3;
        return ((b0 & 0x0Fu) << 12) | (b1 << 6) | b2;
    }
    const auto b3 = static_cast<unsigned char>(p[3]) & 0x3Fu;
    len = 4;
    return ((b0 & 0x07u) << 18) | (b1 << 12) | (b2 << 6) | b3;
}

void append(std::string& out, char32_t cp);

}  // namespace qtrain::utf8
