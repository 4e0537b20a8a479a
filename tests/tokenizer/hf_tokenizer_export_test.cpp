// Writing HF tokenizer files (hf_tokenizer_export.h): what qtrain writes loads back — in qtrain and
// (tests/scripts/hf_tokenizer_export_check.py) in HF `tokenizers` and transformers — to the same ids as
// the tokenizer it came from; built from Qwen's tiktoken ranks it is Qwen2.5's own tokenizer.json.
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "reference_corpus.h"
#include "tiny_tiktoken.h"
#include "tokenizer/hf_tokenizer_export.h"
#include "tokenizer/hf_tokenizer_writer.h"
#include "tokenizer_test_data.h"

namespace qtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::read_file;
using test::write_file;

std::string qwen_tiktoken() { return test::reference_dir() + "/qwen.tiktoken"; }

#define QTRAIN_REQUIRE_QWEN_TIKTOKEN()                                                         \
    if (!fs::exists(qwen_tiktoken()))                                                          \
    GTEST_SKIP() << "no " << qwen_tiktoken() << ": run scripts/tokenizer_fetch_tiktoken.sh"

const std::vector<std::string> kTexts = {
    "hello world, hellohello wor\n", "the theme: in the thin hell  \t\r\n", "", "lll llo ooo",
    "ünïcödé e\xcc\x81 \xe4\xbd\xa0\xe5\xa5\xbd <|endoftext|> <tool_call>x</tool_call> 12345"};

void expect_same_ids(const Tokenizer& a, const Tokenizer& b, const std::string& text) {
    for (const SpecialTokens mode : kModes) EXPECT_EQ(a.encode(text, mode), b.encode(text, mode)) << text;
}

TEST(HfTokenizerExport, TiktokenBecomesATokenizerJsonWithTheSameIds) {
    test::TempDir dir;
    const Tokenizer tik = Tokenizer::load(test::write_tiny_tiktoken(dir.file("tiny.tiktoken"), test::tiny_tiktoken_tokens()));
    const auto files = export_hf_tokenizer(tik, dir.file("out"));
    EXPECT_EQ(files, (std::vector<std::string>{"tokenizer.json", "tokenizer_config.json"}));
    const Tokenizer back = Tokenizer::load(dir.file("out"));
    EXPECT_EQ(back.format(), TokenizerFormat::kHfJson);
    EXPECT_EQ(back.regular_vocab_size(), tik.regular_vocab_size());
    EXPECT_EQ(back.vocab_size(), tik.vocab_size());
    EXPECT_EQ(back.num_merges(), test::tiny_tiktoken_tokens().size());  // one per multi-byte token
    for (const std::string& text : kTexts) expect_same_ids(back, tik, text);
    for (const AddedToken& t : tik.added_tokens()) EXPECT_EQ(back.token_id(t.content), t.id) << t.content;

    const json j = json::parse(read_file(dir.file("out/tokenizer.json")));
    EXPECT_EQ(j["model"]["merges"][2], "he ll");  // "hell": the pair its BPE over lower ranks ends in
    EXPECT_EQ(j["model"]["merges"][6], "\xc4\xa0w or");  // " wor", with the space spelled as U+0120
    EXPECT_EQ(j["normalizer"], json({{"type", "NFC"}}));
}

TEST(HfTokenizerExport, ConfigNamesQwen2TokenizerAndTheBaseModelsEos) {
    test::TempDir dir;
    const Tokenizer tik = Tokenizer::load(test::write_tiny_tiktoken(dir.file("tiny.tiktoken"), test::tiny_tiktoken_tokens()));
    const json c = json::parse(hf_tokenizer_config_json(tik));
    EXPECT_EQ(c["tokenizer_class"], "Qwen2Tokenizer");
    EXPECT_EQ(c["eos_token"], "<|endoftext|>");
    EXPECT_EQ(c["pad_token"], "<|endoftext|>");
    EXPECT_TRUE(c["bos_token"].is_null());
    EXPECT_EQ(c["added_tokens_decoder"].size(), 22u);
    const std::string eot_id = std::to_string(*tik.token_id("<|endoftext|>"));
    EXPECT_EQ(c["added_tokens_decoder"][eot_id]["content"], "<|endoftext|>");
    EXPECT_EQ(c["additional_special_tokens"].size(), 13u);  // Qwen2.5's: the special ones but eos
    EXPECT_EQ(c["additional_special_tokens"][0], "<|im_start|>");
}

TEST(HfTokenizerExport, QwenTiktokenGivesQwenTokenizerJson) {
    QTRAIN_REQUIRE_QWEN_TOKENIZER(real);
    QTRAIN_REQUIRE_QWEN_TIKTOKEN();
    const json ours = json::parse(hf_tokenizer_json_from_ranks(Tokenizer::load(qwen_tiktoken())));
    const json theirs = json::parse(read_file(test::qwen_tokenizer_json()));
    EXPECT_EQ(ours["model"]["vocab"], theirs["model"]["vocab"]);
    ASSERT_EQ(ours["model"]["merges"].size(), theirs["model"]["merges"].size());
    EXPECT_EQ(ours["model"]["merges"], theirs["model"]["merges"]);  // same pairs, same order
    EXPECT_EQ(ours, theirs);  // and every other key: added tokens, normalizer, pre-tokenizer, decoder
}

TEST(HfTokenizerExport, ExportedQwenTiktokenGivesItsIdsOnTheReferenceCorpus) {
    QTRAIN_REQUIRE_QWEN_TIKTOKEN();
    QTRAIN_REQUIRE_REFERENCE(docs);
    test::TempDir dir;
    const Tokenizer tik = Tokenizer::load(qwen_tiktoken());
    export_hf_tokenizer(tik, dir.str());
    const Tokenizer back = Tokenizer::load(dir.file("tokenizer.json"));
    for (int m = 0; m < 3; ++m) {
        int failures = 0;
        for (std::size_t i = 0; i < docs->size() && failures < 5; ++i) {
            const auto got = back.encode((*docs)[i].raw, kModes[m]);
            if (got != tik.encode((*docs)[i].raw, kModes[m])) {
                ++failures;
                ADD_FAILURE() << kModeNames[m] << ": document " << i << " differs";
            }
        }
    }
}

TEST(HfTokenizerExport, TokenizerJsonIsCopiedWithTheFilesBesideIt) {
    test::TempDir src, out;
    const std::string path = test::write_tiny_tokenizer_json(src.str(), {{"h", "e"}, {"l", "l"}}, false);
    write_file(src.file("tokenizer_config.json"), R"({"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>"})");
    write_file(src.file("merges.txt"), "#version: 0.2\nh e\nl l\n");
    // transformers 5 keeps the chat template beside tokenizer_config.json: a fine-tuned model needs it
    write_file(src.file("chat_template.jinja"), "{% for m in messages %}{{ m.content }}{% endfor %}");
    write_file(out.file("vocab.json"), "{}");  // left by an earlier run: must go
    const Tokenizer tok = Tokenizer::load(path);
    EXPECT_EQ(export_hf_tokenizer(tok, out.str()),
              (std::vector<std::string>{"tokenizer.json", "tokenizer_config.json", "merges.txt", "chat_template.jinja"}));
    EXPECT_EQ(read_file(out.file("chat_template.jinja")), read_file(src.file("chat_template.jinja")));
    EXPECT_EQ(read_file(out.file("tokenizer.json")), read_file(path));
    EXPECT_EQ(read_file(out.file("tokenizer_config.json")), read_file(src.file("tokenizer_config.json")));
    EXPECT_EQ(read_file(out.file("merges.txt")), read_file(src.file("merges.txt")));
    EXPECT_FALSE(fs::exists(out.file("vocab.json")));

    // exporting into the tokenizer's own directory leaves it as it is
    EXPECT_EQ(export_hf_tokenizer(tok, src.str()).size(), 4u);
    EXPECT_EQ(read_file(path), read_file(out.file("tokenizer.json")));
}

TEST(HfTokenizerExport, LoneTokenizerJsonGetsAConfig) {
    test::TempDir src, out;
    const std::string path = test::write_tiny_tokenizer_json(src.str(), {{"h", "e"}}, false);
    fs::rename(path, src.file("my-tokenizer.json"));  // not a model directory: nothing beside it counts
    write_file(src.file("tokenizer_config.json"), "{}");
    const Tokenizer tok = Tokenizer::load(src.file("my-tokenizer.json"));
    EXPECT_EQ(export_hf_tokenizer(tok, out.str()), (std::vector<std::string>{"tokenizer.json", "tokenizer_config.json"}));
    const json c = json::parse(read_file(out.file("tokenizer_config.json")));
    EXPECT_EQ(c["eos_token"], "<|endoftext|>");
    EXPECT_EQ(c["added_tokens_decoder"].size(), 2u);
    EXPECT_EQ(Tokenizer::load(out.str()).encode("hehe"), tok.encode("hehe"));
}

TEST(HfTokenizerExport, WhatCannotBeWrittenGivesClearErrors) {
    test::TempDir dir;
    // "abc" with neither "ab" nor "bc" below it: tiktoken's BPE never reaches it
    const std::string path = test::write_tiny_tiktoken(dir.file("odd.tiktoken"), {"abc"});
    EXPECT_ERROR(export_hf_tokenizer(Tokenizer::load(path), dir.file("out")),
                 "odd.tiktoken: token 256 (3 bytes) is not reached by BPE over the lower ranks");

    TokenizerSpec spec;
    for (int b = 0; b < 256; ++b) spec.tokens.emplace_back(1, static_cast<char>(b));
    EXPECT_ERROR(export_hf_tokenizer(Tokenizer(std::move(spec)), dir.file("out")), "built in memory");
}

}  // namespace
}  // namespace qtrain
