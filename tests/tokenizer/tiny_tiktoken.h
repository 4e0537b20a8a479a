// A tiny tiktoken rank file the tests write themselves (so they run everywhere): the 256 single
// bytes in byte order, then the given multi-byte tokens, each ranked after the ones before it.
// Header-only: the train tests use it too.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace qtrain::test {

inline std::string base64(const std::string& s) {
    const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    for (std::size_t i = 0; i < s.size(); i += 3) {
        uint32_t v = static_cast<uint32_t>(static_cast<uint8_t>(s[i])) << 16;
        if (i + 1 < s.size()) v |= static_cast<uint32_t>(static_cast<uint8_t>(s[i + 1])) << 8;
        if (i + 2 < s.size()) v |= static_cast<uint8_t>(s[i + 2]);
        out += digits[(v >> 18) & 63];
        out += digits[(v >> 12) & 63];
        out += i + 1 < s.size() ? digits[(v >> 6) & 63] : '=';
        out += i + 2 < s.size() ? digits[v & 63] : '=';
    }
    return out;
}

// Writes `path`; returns it. qtrain gives the file Qwen's 22 added tokens after the ranks.
inline std::string write_tiny_tiktoken(const std::string& path, const std::vector<std::string>& tokens) {
    std::ofstream out(path, std::ios::binary);
    int rank = 0;
    for (int b = 0; b < 256; ++b) out << base64(std::string(1, static_cast<char>(b))) << " " << rank++ << "\n";
    for (const std::string& t : tokens) out << base64(t) << " " << rank++ << "\n";
    return path;
}

// Tokens that BPE reaches one pair at a time (each is two earlier tokens), with spaces, so that
// encoding text with them exercises merges across the Qwen2 pieces (" wor" is one piece).
inline const std::vector<std::string>& tiny_tiktoken_tokens() {
    static const std::vector<std::string> tokens = {"he", "ll", "hell", "hello", " w", "or", " wor", "ld", "in", " t", " th", "the", " the"};
    return tokens;
}

}  // namespace qtrain::test
