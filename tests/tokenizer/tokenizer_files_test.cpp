// Loading tokenizer.json (both merge forms) and tiktoken files, special-token modes, decode, and
// the errors for files qtrain cannot use.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tiny_tiktoken.h"
#include "tokenizer_test_data.h"

namespace qtrain {
namespace {

const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {"o", "r"}, {" w", "or"}};

std::vector<std::string> spelled(const Tokenizer& tok, const std::vector<int32_t>& ids) {
    std::vector<std::string> out;
    for (int32_t id : ids) out.push_back(tok.decode(std::span(&id, 1)));
    return out;
}

using V = std::vector<std::string>;

TEST(TokenizerJson, BothMergeFormsGiveTheSameIds) {
    test::TempDir a, b;
    const Tokenizer string_form = Tokenizer::load(test::write_tiny_tokenizer_json(a.str(), kMerges, false));
    test::write_tiny_tokenizer_json(b.str(), kMerges, true);
    const Tokenizer pairs = Tokenizer::load(b.str());  // a directory holding tokenizer.json
    const std::string text = "hello world, hello\n";
    EXPECT_EQ(string_form.encode(text), pairs.encode(text));
    EXPECT_EQ(spelled(string_form, string_form.encode(text)),
              (V{"hello", " wor", "l", "d", ",", " ", "hello", "\n"}));
    EXPECT_EQ(string_form.regular_vocab_size(), 256 + 7);
    EXPECT_EQ(string_form.vocab_size(), 256 + 7 + 2);
}

TEST(TokenizerJson, SpecialTokenModes) {
    test::TempDir dir;
    const Tokenizer tok = Tokenizer::load(test::write_tiny_tokenizer_json(dir.str(), kMerges, false));
    const int32_t eot = *tok.token_id("<|endoftext|>"), call = *tok.token_id("<tool_call>");
    const std::string text = "hello<|endoftext|><tool_call>";
    const std::vector<int32_t> as_text = tok.encode(text, SpecialTokens::kAsText);
    const std::vector<int32_t> recognize = tok.encode(text, SpecialTokens::kRecognize);
    const std::vector<int32_t> none = tok.encode(text, SpecialTokens::kNone);
    // kAsText: the special token is text, the non-special one still a token (as HF does).
    EXPECT_EQ(std::count(as_text.begin(), as_text.end(), eot), 0);
    EXPECT_EQ(as_text.back(), call);
    EXPECT_EQ(recognize, (std::vector<int32_t>{*tok.token_id("hello"), eot, call}));
    EXPECT_EQ(std::count(none.begin(), none.end(), call), 0);
    for (const auto& ids : {as_text, recognize, none}) EXPECT_EQ(tok.decode(ids), text);
    EXPECT_EQ(tok.decode(recognize, /*skip_special=*/true), "hello<tool_call>");
}

TEST(TokenizerJson, InvalidUtf8IsReplacedAndCounted) {
    test::TempDir dir;
    const Tokenizer tok = Tokenizer::load(test::write_tiny_tokenizer_json(dir.str(), kMerges, false));
    std::vector<int32_t> ids;
    EncodeStats stats;
    tok.encode("he\xff\xc0llo", ids, SpecialTokens::kAsText, &stats);
    EXPECT_EQ(stats.invalid_utf8, 2u);
    EXPECT_EQ(tok.decode(ids), "he\xEF\xBF\xBD\xEF\xBF\xBDllo");
}

TEST(TokenizerJson, IgnoreMergesTakesWholeTokens) {
    test::TempDir dir;
    const std::string path = test::write_tiny_tokenizer_json(dir.str(), {{"a", "b"}, {"b", "c"}, {"a", "bc"}}, false);
    const Tokenizer plain = Tokenizer::load(path);
    EXPECT_EQ(spelled(plain, plain.encode("abc")), (V{"ab", "c"}));  // a+b merges first
    nlohmann::json j;
    std::ifstream(path) >> j;
    j["model"]["ignore_merges"] = true;
    std::ofstream(path) << j.dump();
    const Tokenizer whole = Tokenizer::load(path);
    EXPECT_EQ(spelled(whole, whole.encode("abc abcab")), (V{"abc", " ", "ab", "c", "ab"}));
}

TEST(TokenizerJson, DecodeTextRepairsCutCharacters) {
    test::TempDir dir;
    const Tokenizer tok = Tokenizer::load(test::write_tiny_tokenizer_json(dir.str(), kMerges, false));
    const std::vector<int32_t> ids = tok.encode("\xE4\xB8\xAD");  // three byte tokens
    EXPECT_EQ(tok.decode_text(ids), "\xE4\xB8\xAD");
    EXPECT_EQ(tok.decode_text(std::span(ids).first(2)), "\xEF\xBF\xBD");
}

TEST(TokenizerJson, ClearErrors) {
    test::TempDir dir;
    EXPECT_ERROR(Tokenizer::load(dir.file("nope.json")), "nope.json' does not exist");
    EXPECT_ERROR(Tokenizer::load(dir.str()), "neither tokenizer.json nor qwen.tiktoken");
    std::ofstream(dir.file("bad.json")) << "{ not json";
    EXPECT_ERROR(Tokenizer::load(dir.file("bad.json")), "not a valid tokenizer.json");

    const std::string path = test::write_tiny_tokenizer_json(dir.str(), kMerges, false);
    const std::string text = test::read_file(path);
    auto with = [&](const std::string& from, const std::string& to) {
        std::string t = text;
        t.replace(t.find(from), from.size(), to);
        std::ofstream(dir.file("edited.json")) << t;
        return dir.file("edited.json");
    };
    EXPECT_ERROR(Tokenizer::load(with("\"Isolated\"", "\"Removed\"")), "unsupported pre_tokenizer");
    EXPECT_ERROR(Tokenizer::load(with("\"type\": \"NFC\"", "\"type\": \"NFKC\"")),
                 "unsupported normalizer");
    EXPECT_ERROR(Tokenizer::load(with("\"he ll\"", "\"he zz\"")), "'zz', which is not in model.vocab");
}

// A tiktoken file with the same tokens as the tiny tokenizer.json gives the same ids: merges are
// implied by the ranks.
TEST(Tiktoken, RanksImplyTheMerges) {
    test::TempDir dir;
    const Tokenizer json_tok = Tokenizer::load(test::write_tiny_tokenizer_json(dir.str(), kMerges, false));
    {
        std::ofstream out(dir.file("tiny.tiktoken"));
        for (int32_t id = 0; id < json_tok.regular_vocab_size(); ++id) {
            out << test::base64(json_tok.decode(std::span(&id, 1))) << " " << id << "\n";
        }
    }
    const Tokenizer tik = Tokenizer::load(dir.file("tiny.tiktoken"));
    const std::string text = "hello world, hellohello wor\n";
    EXPECT_EQ(tik.encode(text), json_tok.encode(text));
    EXPECT_EQ(tik.token_id("<|endoftext|>"), tik.regular_vocab_size());  // Qwen's added tokens follow
    EXPECT_EQ(tik.vocab_size(), tik.regular_vocab_size() + 22);

    std::ofstream(dir.file("broken.tiktoken")) << "aGVsbG8= 0\nnot-base64! 1\n";
    EXPECT_ERROR(Tokenizer::load(dir.file("broken.tiktoken")), "broken.tiktoken:2: not a tiktoken rank line");
}

}  // namespace
}  // namespace qtrain
