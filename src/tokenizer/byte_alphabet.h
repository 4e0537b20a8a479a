// GPT-2's byte-level alphabet, which tokenizer.json uses to spell byte strings as text: each byte is
// one printable code point (printable bytes stand for themselves, the other 68 map to U+0100
// onward in byte order), so every token and merge is valid UTF-8 without spaces. Reading a
// tokenizer.json needs code point -> byte, writing one needs byte -> code point.
#pragma once

#include <algorithm>
#include <iterator>
#include <string>
#include <string_view>

#include "tokenizer/utf8.h"

namespace qtrain {

struct ByteAlphabet {
    int byte_of[512];        // code point -> byte, -1 when the code point is not in the alphabet
    char32_t code_point[256];  // byte -> code point
    ByteAlphabet() {
        std::fill(std::begin(byte_of), std::end(byte_of), -1);
        char32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
            code_point[b] = printable ? static_cast<char32_t>(b) : next++;
            byte_of[code_point[b]] = b;
        }
    }
    static const ByteAlphabet& get() {
        static const ByteAlphabet alphabet;
        return alphabet;
    }
    // The tokenizer.json spelling of `bytes`.
    std::string spell(std::string_view bytes) const {
        std::string out;
        for (const char c : bytes) utf8::append(out, code_point[static_cast<unsigned char>(c)]);
        return out;
    }
};

}  // namespace qtrain
