// BPE merge order on tiny vocabularies, and the two merge loops agreeing.
#include <random>

#include <gtest/gtest.h>

#include "tokenizer/bpe.h"
#include "tokenizer_test_data.h"

namespace qtrain {
namespace {

// Byte tokens 0..255, then `extra` tokens; merges given as (left, right) token strings.
BpeModel make_model(const std::vector<std::string>& extra,
                    const std::vector<std::pair<std::string, std::string>>& merges) {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
    tokens.insert(tokens.end(), extra.begin(), extra.end());
    auto id = [&](const std::string& s) {
        for (std::size_t i = 0; i < tokens.size(); ++i) {
            if (tokens[i] == s) return static_cast<int32_t>(i);
        }
        ADD_FAILURE() << "no token " << s;
        return -1;
    };
    BpeModel model(tokens);
    int32_t rank = 0;
    for (const auto& [l, r] : merges) model.add_merge(id(l), id(r), rank++, id(l + r));
    return model;
}

std::vector<std::string> spelled(const BpeModel& m, std::string_view text) {
    std::vector<int32_t> ids;
    m.encode(text, ids);
    std::vector<std::string> out;
    for (int32_t id : ids) out.push_back(m.token(id));
    return out;
}

using V = std::vector<std::string>;

TEST(Bpe, LowestRankMergesFirst) {
    const BpeModel bc_first = make_model({"bc", "ab"}, {{"b", "c"}, {"a", "b"}});
    EXPECT_EQ(spelled(bc_first, "abc"), (V{"a", "bc"}));
    const BpeModel ab_first = make_model({"bc", "ab"}, {{"a", "b"}, {"b", "c"}});
    EXPECT_EQ(spelled(ab_first, "abc"), (V{"ab", "c"}));
}

TEST(Bpe, TiesGoToTheLeftmostPair) {
    const BpeModel m = make_model({"aa", "aaa"}, {{"a", "a"}});
    EXPECT_EQ(spelled(m, "aaa"), (V{"aa", "a"}));
    EXPECT_EQ(spelled(m, "aaaaa"), (V{"aa", "aa", "a"}));
    const BpeModel m2 = make_model({"aa", "aaa"}, {{"a", "a"}, {"aa", "a"}});
    EXPECT_EQ(spelled(m2, "aaa"), (V{"aaa"}));
}

TEST(Bpe, UnknownPairsStayBytes) {
    const BpeModel m = make_model({"ab"}, {{"a", "b"}});
    EXPECT_EQ(spelled(m, std::string_view("\xff" "ab\0", 4)), (V{"\xff", "ab", std::string(1, '\0')}));
    EXPECT_TRUE(spelled(m, "").empty());
}

// The short (array) and long (heap) loops must agree on every piece.
void expect_loops_agree(const BpeModel& m, const std::string& alphabet, int trials) {
    std::mt19937 rng(7);
    for (int t = 0; t < trials; ++t) {
        std::string piece;
        const int len = 1 + static_cast<int>(rng() % 200);
        for (int i = 0; i < len; ++i) piece += alphabet[rng() % alphabet.size()];
        std::vector<int32_t> a, b;
        m.encode_short(piece, a);
        m.encode_long(piece, b);
        ASSERT_EQ(a, b) << "piece '" << piece << "'";
    }
}

TEST(Bpe, ShortAndLongLoopsAgree) {
    const BpeModel m = make_model({"aa", "ab", "ba", "aaa", "aab", "abab", "bb"},
                                  {{"a", "b"}, {"a", "a"}, {"b", "a"}, {"aa", "a"}, {"ab", "ab"},
                                   {"aa", "b"}, {"b", "b"}});
    expect_loops_agree(m, "ab", 3000);
}

TEST(Bpe, ShortAndLongLoopsAgreeOnQwen) {
    QTRAIN_REQUIRE_QWEN_TOKENIZER(tok);
    expect_loops_agree(tok->bpe(), " \n\tabcdeilnorstABC0123.,'=-_\xe4\xb8\xad", 3000);
}

}  // namespace
}  // namespace qtrain
