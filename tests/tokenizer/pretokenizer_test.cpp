// The hand-written Qwen2 pre-tokenizer on cases whose pieces come from HF `tokenizers`' regex
// (the reference test covers a large corpus; these name the rules one by one).
#include <gtest/gtest.h>

#include "tokenizer/pretokenizer.h"

namespace qtrain {
namespace {

std::vector<std::string> pieces(std::string_view text) {
    std::vector<std::string_view> views;
    qwen2_pretokenize(text, views);
    return {views.begin(), views.end()};
}

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

}  // namespace
}  // namespace qtrain
