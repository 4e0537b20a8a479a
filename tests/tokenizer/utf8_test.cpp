// Invalid UTF-8 is replaced as Python's bytes.decode("utf-8", errors="replace") does (expected
// values below come from Python): one U+FFFD per maximal ill-formed subsequence.
#include <gtest/gtest.h>

#include "tokenizer/utf8.h"

namespace qtrain {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

std::string repaired(std::string_view in, std::size_t* count = nullptr) {
    std::string out;
    const std::size_t n = utf8::append_repaired(in, out);
    if (count) *count = n;
    return out;
}

TEST(Utf8, ValidTextIsUntouched) {
    const std::string text = "plain ASCII, caf\xC3\xA9, \xE4\xB8\xAD\xE6\x96\x87, \xF0\x9F\x98\x80";
    EXPECT_EQ(utf8::valid_prefix(text), text.size());
    EXPECT_EQ(repaired(text), text);
}

TEST(Utf8, ReplacesMaximalSubpartsLikePython) {
    struct Case {
        std::string in;
        std::size_t replacements;
        std::string out;
    };
    const Case cases[] = {
        {"\xFF", 1, kFffd},
        {"\xC0\xAF", 2, kFffd + kFffd},                          // overlong: two bad bytes
        {"\xE0\x80\xAF", 3, kFffd + kFffd + kFffd},              // overlong 3-byte form
        {"\xED\xA0\x80", 3, kFffd + kFffd + kFffd},              // a UTF-16 surrogate
        {"\xF4\x90\x80\x80", 4, kFffd + kFffd + kFffd + kFffd},  // above U+10FFFF
        {"abc\xE4\xB8", 1, "abc" + kFffd},                       // truncated at the end
        {"\xF0\x9F\x98 x", 1, kFffd + " x"},                     // truncated before a space
        {"\xE2\x82\n", 1, kFffd + "\n"},
    };
    for (const Case& c : cases) {
        std::size_t n = 0;
        EXPECT_EQ(repaired(c.in, &n), c.out);
        EXPECT_EQ(n, c.replacements);
        EXPECT_LT(utf8::valid_prefix(c.in), c.in.size());
    }
}

TEST(Utf8, DecodeAndAppendRoundTrip) {
    for (const char32_t cp : {U'\0', U'A', U'\u00E9', U'\u4E2D', U'\U0001F600', U'\U0010FFFF'}) {
        std::string s;
        utf8::append(s, cp);
        int len = 0;
        EXPECT_EQ(utf8::decode(s.data(), len), cp);
        EXPECT_EQ(static_cast<std::size_t>(len), s.size());
    }
}

}  // namespace
}  // namespace qtrain
