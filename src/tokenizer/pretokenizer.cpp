// Each alternative of the regex, tried in order at the start of the next piece (c = the first
// character, "next" = the one after it):
//  1. (?i:'s|'t|'re|'ve|'m|'ll|'d): c is ' and the following letters spell a contraction. The
//     reference matches case-insensitively with Unicode folding, so U+017F (long s) counts as s;
//     no other character folds to these letters.
//  2. [^\r\n\p{L}\p{N}]?\p{L}+: c is a letter (take the run of letters), or c is neither CR, LF,
//     letter nor number and next is a letter (c plus the run).
//  3. \p{N} (Qwen2): one number character, so digits are always single pieces; \p{N}{1,3}
//     (Llama 3): up to three number characters, greedy (a run of seven gives 3 + 3 + 1). Only a
//     number starts it: alternative 2's optional first character excludes \p{N}.
//  4.  ?[^\s\p{L}\p{N}]+[\r\n]*: a run of "other" characters (not space, letter or number),
//     optionally after one ' ', then any CR/LF run.
//  5. \s*[\r\n]+: c is a space character and its run of spaces holds a CR or LF; backtracking
//     ends the match just after the last CR/LF of the run.
//  6. \s+(?!\S): a space run that ends the text is taken whole; one followed by a non-space
//     gives back its last character (which then starts the next piece), if it has two or more.
//  7. \s+: a single space character before a non-space.
#include "tokenizer/pretokenizer.h"

#include "tokenizer/unicode_tables.h"
#include "tokenizer/utf8.h"

namespace qtrain {

const SplitPattern kQwen2Split = {
    "Qwen2",
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
    1};
const SplitPattern kLlama3Split = {
    "Llama 3",
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
    3};

const SplitPattern* find_split_pattern(std::string_view regex) {
    for (const SplitPattern* p : {&kQwen2Split, &kLlama3Split}) {
        if (regex == p->regex) return p;
    }
    return nullptr;
}

namespace {

enum Class : uint8_t { kOther, kLetter, kNumber, kSpace, kNewline /* CR or LF, also \s */ };

struct Char {
    char32_t cp;
    Class cls;
    int len;
};

// Classifies the code point at `pos` (pos < text.size()).
inline Char char_at(std::string_view text, std::size_t pos) {
    const auto b = static_cast<unsigned char>(text[pos]);
    char32_t cp;
    int len;
    if (b < 0x80) {
        cp = b;
        len = 1;
        if (b == '\r' || b == '\n') return {cp, kNewline, 1};
    } else {
        cp = utf8::decode(text.data() + pos, len);
    }
    const uint8_t p = unicode::properties(cp);
    const Class cls = (p & unicode::kLetter)   ? kLetter
                      : (p & unicode::kNumber) ? kNumber
                      : (p & unicode::kSpace)  ? kSpace
                                               : kOther;
    return {cp, cls, len};
}

bool folds_to(char32_t cp, char lower) {
    return cp == static_cast<char32_t>(lower) || cp == static_cast<char32_t>(lower - 'a' + 'A') ||
           (lower == 's' && cp == 0x17F);
}

// Length in bytes of a contraction starting with the ' at `pos`, or 0.
std::size_t contraction(std::string_view text, std::size_t pos) {
    const std::size_t p1 = pos + 1;
    if (p1 >= text.size()) return 0;
    const Char c1 = char_at(text, p1);
    for (char single : {'s', 't', 'm', 'd'}) {
        if (folds_to(c1.cp, single)) return 1 + c1.len;
    }
    const std::size_t p2 = p1 + c1.len;
    if (p2 >= text.size()) return 0;
    const Char c2 = char_at(text, p2);
    const bool re_ve = (folds_to(c1.cp, 'r') || folds_to(c1.cp, 'v')) && folds_to(c2.cp, 'e');
    const bool ll = folds_to(c1.cp, 'l') && folds_to(c2.cp, 'l');
    return re_ve || ll ? 1 + c1.len + c2.len : 0;
}

// End of the run of characters whose class satisfies `pred`, starting at `pos`.
template <class Pred>
std::size_t run_end(std::string_view text, std::size_t pos, Pred pred) {
    while (pos < text.size()) {
        const Char c = char_at(text, pos);
        if (!pred(c.cls)) break;
        pos += c.len;
    }
    return pos;
}

// Length of the piece that starts at `pos`.
std::size_t piece_length(std::string_view text, std::size_t pos, int max_digits) {
    const Char c = char_at(text, pos);
    const std::size_t after = pos + c.len;
    const bool has_next = after < text.size();
    const Char next = has_next ? char_at(text, after) : Char{0, kOther, 0};

    if (c.cp == '\'') {  // 1
        if (const std::size_t n = contraction(text, pos)) return n;
    }
    if (c.cls == kLetter) {  // 2
        return run_end(text, after, [](Class k) { return k == kLetter; }) - pos;
    }
    if ((c.cls == kOther || c.cls == kSpace) && has_next && next.cls == kLetter) {
        return run_end(text, after + next.len, [](Class k) { return k == kLetter; }) - pos;
    }
    if (c.cls == kNumber) {  // 3
        std::size_t end = after;
        for (int n = 1; n < max_digits && end < text.size(); ++n) {
            const Char d = char_at(text, end);
            if (d.cls != kNumber) break;
            end += d.len;
        }
        return end - pos;
    }
    auto other_then_newlines = [&](std::size_t from) {  // 4
        const std::size_t e = run_end(text, from, [](Class k) { return k == kOther; });
        return run_end(text, e, [](Class k) { return k == kNewline; }) - pos;
    };
    if (c.cp == ' ' && has_next && next.cls == kOther) return other_then_newlines(after);
    if (c.cls == kOther) return other_then_newlines(pos);

    // c is a space or CR/LF: 5, 6, 7 over its run of \s characters.
    std::size_t end = pos, last_newline_end = 0, last_start = pos;
    int count = 0;
    while (end < text.size()) {
        const Char s = char_at(text, end);
        if (s.cls != kSpace && s.cls != kNewline) break;
        last_start = end;
        end += s.len;
        ++count;
        if (s.cls == kNewline) last_newline_end = end;
    }
    if (last_newline_end != 0) return last_newline_end - pos;   // 5
    if (end == text.size() || count == 1) return end - pos;     // 6 at the end, or 7
    return last_start - pos;                                    // 6 gives back the last one
}

}  // namespace

void pretokenize(std::string_view text, const SplitPattern& pattern, std::vector<std::string_view>& pieces) {
    std::size_t pos = 0;
    while (pos < text.size()) {
        const std::size_t n = piece_length(text, pos, pattern.max_digits);
        pieces.push_back(text.substr(pos, n));
        pos += n;
    }
}

}  // namespace qtrain
