// The hand-written pre-tokenizer on cases whose pieces come from HF `tokenizers`' regex, Qwen2's and
// Llama 3's (the reference test covers a large corpus; these name the rules one by one).
#include <gtest/gtest.h>

#include "tokenizer/pretokenizer.h"

namespace qtrain {
namespace {

std::vector<std::string> pieces(std::string_view text, const SplitPattern& pattern = kQwen2Split) {
    std::vector<std::string_view> views;
    pretokenize(text, pattern, views);
    return {views.begin(), views.end()};
}

std::vector<std::string> llama3_pieces(std::string_view text) { return pieces(text, kLlama3Split); }

using V = std::vector<std::string>;

TEST(Qwen2Pretokenizer, WordsTakeTheirLeadingSpace) {
    EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
    EXPECT_EQ(pieces("\t\tfoo"), (V{"\t", "\tfoo"}));
    EXPECT_EQ(pieces("a\u00a0b"), (V{"a", "\u00a0b"}));  // NBSP is \s, and not CR/LF
    EXPECT_EQ(pieces("中文 字符。"), (V{"中文", " 字符", "。"}));
}

TEST(Qwen2Pretokenizer, ContractionsIgnoreCase) {
    EXPECT_EQ(pieces("I'm here, they'LL go"), (V{"I", "'m", " here", ",", " they", "'LL", " go"}));
    EXPECT_EQ(pieces("don't"), (V{"don", "'t"}));
    EXPECT_EQ(pieces("'\u017ft"), (V{"'\u017f", "t"}));  // long s folds to s
}

TEST(Qwen2Pretokenizer, DigitsAreSinglePieces) {
    EXPECT_EQ(pieces("123abc"), (V{"1", "2", "3", "abc"}));
}

TEST(Qwen2Pretokenizer, PunctuationKeepsOneSpaceAndTrailingNewlines) {
    EXPECT_EQ(pieces(" ...\n\nnext"), (V{" ...\n\n", "next"}));
    EXPECT_EQ(pieces("!!! ??\n"), (V{"!!!", " ??\n"}));
    EXPECT_EQ(pieces("   ("), (V{"  ", " ("}));
}

TEST(Qwen2Pretokenizer, WhitespaceRuns) {
    EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));             // the last space joins the word
    EXPECT_EQ(pieces("a   "), (V{"a", "   "}));                 // at the end: the whole run
    EXPECT_EQ(pieces("x \n\n  y"), (V{"x", " \n\n", " ", " y"}));  // up to the last newline
    EXPECT_EQ(pieces("r\r\n\r\nz"), (V{"r", "\r\n\r\n", "z"}));
    EXPECT_EQ(pieces("  \u3000x"), (V{"  ", "\u3000x"}));
}

TEST(Qwen2Pretokenizer, PiecesCoverTheText) {
    const std::string text = "Mixed: 12 apples, 'tis\r\n\tend  ";
    std::string joined;
    for (const auto& p : pieces(text)) joined += p;
    EXPECT_EQ(joined, text);
    EXPECT_TRUE(pieces("").empty());
}

// The Llama 3 regex differs only in \p{N}{1,3}; expected pieces from HF's Split(Regex, Isolated).
TEST(Llama3Pretokenizer, DigitRunsOfUpToThree) {
    EXPECT_EQ(llama3_pieces("1 22 333 4444 55555 666666 7777777"),
              (V{"1", " ", "22", " ", "333", " ", "444", "4", " ", "555", "55", " ", "666", "666", " ", "777",
                 "777", "7"}));
    EXPECT_EQ(llama3_pieces("x1234567y"), (V{"x", "123", "456", "7", "y"}));
    EXPECT_EQ(llama3_pieces("12 345,6789"), (V{"12", " ", "345", ",", "678", "9"}));
    EXPECT_EQ(llama3_pieces(" 1234\n5678"), (V{" ", "123", "4", "\n", "567", "8"}));
    EXPECT_EQ(llama3_pieces("$1000000"), (V{"$", "100", "000", "0"}));
    EXPECT_EQ(llama3_pieces("v1.22.333"), (V{"v", "1", ".", "22", ".", "333"}));
    // \p{N} is every number character: other scripts' digits, superscripts, circled, Roman numerals.
    EXPECT_EQ(llama3_pieces("\u0663\u0664\u0665\u0666\u0667"), (V{"\u0663\u0664\u0665", "\u0666\u0667"}));
    EXPECT_EQ(llama3_pieces("1\u00b2\u00b34"), (V{"1\u00b2\u00b3", "4"}));
    EXPECT_EQ(llama3_pieces("\u2460\u2461\u2462\u2463"), (V{"\u2460\u2461\u2462", "\u2463"}));
    EXPECT_EQ(llama3_pieces("\u216b123"), (V{"\u216b12", "3"}));
    EXPECT_EQ(pieces("1234567"), (V{"1", "2", "3", "4", "5", "6", "7"}));  // Qwen2: one at a time
}

TEST(Llama3Pretokenizer, EverythingElseAsQwen2) {
    EXPECT_EQ(llama3_pieces("I'M DON'T WE'LL THEY'RE YOU'VE HE'D IT'S"),
              (V{"I", "'M", " DON", "'T", " WE", "'LL", " THEY", "'RE", " YOU", "'VE", " HE", "'D", " IT", "'S"}));
    for (const std::string_view text : {"Hello world", "\t\tfoo", " ...\n\nnext", "x \n\n  y", "a   ",
                                        "r\r\n\r\nz", "\u4e2d\u6587 \u5b57\u7b26\u3002", "'\u017ft"}) {
        EXPECT_EQ(llama3_pieces(text), pieces(text)) << text;
    }
}

TEST(SplitPatterns, OnlyTheImplementedRegexesAreFound) {
    EXPECT_EQ(find_split_pattern(kQwen2Split.regex), &kQwen2Split);
    EXPECT_EQ(find_split_pattern(kLlama3Split.regex), &kLlama3Split);
    EXPECT_EQ(kQwen2Split.max_digits, 1);
    EXPECT_EQ(kLlama3Split.max_digits, 3);
    // The two differ in exactly \p{N} vs \p{N}{1,3}.
    std::string qwen = kQwen2Split.regex;
    qwen.replace(qwen.find(R"(\p{N}|)"), 6, R"(\p{N}{1,3}|)");
    EXPECT_EQ(qwen, kLlama3Split.regex);
    EXPECT_EQ(find_split_pattern(R"(\p{N}{1,2})"), nullptr);
    EXPECT_EQ(find_split_pattern(""), nullptr);
}

}  // namespace
}  // namespace qtrain
