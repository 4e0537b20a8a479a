#include "tokenizer/utf8.h"

#include <cstring>

namespace qtrain::utf8 {
namespace {

// For a lead byte: how many continuation bytes follow and the allowed range of the first one (the
// narrower ranges exclude overlong forms, surrogates and code points above U+10FFFF). need == -1:
// the byte can never start a character.
struct Lead {
    int need;
    unsigned char lo, hi;
};

Lead lead_info(unsigned char b) {
    if (b < 0x80) return {0, 0, 0};
    if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
    if (b == 0xE0) return {2, 0xA0, 0xBF};
    if (b == 0xED) return {2, 0x80, 0x9F};
    if (b >= 0xE1 && b <= 0xEF) return {2, 0x80, 0xBF};
    if (b == 0xF0) return {3, 0x90, 0xBF};
    if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
    if (b == 0xF4) return {3, 0x80, 0x8F};
    return {-1, 0, 0};
}

// Length of the well-formed character at text[i], or minus the length of the maximal ill-formed
// subpart starting there (at least 1 byte).
long scan_one(std::string_view text, std::size_t i) {
    const auto b = static_cast<unsigned char>(text[i]);
    const Lead lead = lead_info(b);
    if (lead.need == 0) return 1;
    if (lead.need < 0) return -1;
    std::size_t j = i + 1;
    for (int k = 0; k < lead.need; ++k, ++j) {
        if (j >= text.size()) return -static_cast<long>(j - i);
        const auto c = static_cast<unsigned char>(text[j]);
        const unsigned char lo = k == 0 ? lead.lo : 0x80, hi = k == 0 ? lead.hi : 0xBF;
        if (c < lo || c > hi) return -static_cast<long>(j - i);
    }
    return static_cast<long>(j - i);
}

}  // namespace

std::size_t valid_prefix(std::string_view text) {
    std::size_t i = 0;
    const std::size_t n = text.size();
    while (i < n) {
        // ASCII runs are the common case: check eight bytes at a time.
        while (i + 8 <= n) {
            uint64_t word;
            std::memcpy(&word, text.data() + i, 8);
            if (word & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (static_cast<unsigned char>(text[i]) < 0x80) {
            ++i;
            continue;
        }
        const long len = scan_one(text, i);
        if (len < 0) return i;
        i += static_cast<std::size_t>(len);
    }
    return n;
}

std::size_t append_repaired(std::string_view text, std::string& out) {
    std::size_t replaced = 0;
    std::size_t i = 0;
    while (i < text.size()) {
        const std::size_t good = valid_prefix(text.substr(i));
        out.append(text.data() + i, good);
        i += good;
        if (i >= text.size()) break;
        const long len = scan_one(text, i);  // negative: ill-formed
        out.append("\xEF\xBF\xBD");
        ++replaced;
        i += static_cast<std::size_t>(-len);
    }
    return replaced;
}

void append(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

}  // namespace qtrain::utf8
