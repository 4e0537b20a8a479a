// Chat data (issue 31): token byte offsets (Tokenizer::encode_with_offsets), spans -> masks, and
// `tokenize --chat` end to end with a small template (tests/tokenizer/data/tiny_chat.jinja) and the
// tiny tokenizer the tests write. The renderer needs python3 with jinja2; those tests skip without it.
// tests/reference/compare_chat.py checks the real templates against transformers.
#include <cstdlib>
#include <filesystem>
#include <random>

#include <gtest/gtest.h>

#include "io/token_file.h"
#include "tokenizer/chat_mask.h"
#include "tokenizer/tokenizer.h"
#include "reference_corpus.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_data.h"

namespace qtrain {
namespace {

using test::RunResult;
using test::write_file;

const std::vector<std::string> kPieces = {"hello", " ", "world", "\n", "  ", "e\xCC\x81", "\xC3\xA9", "\xCC\x81",
                                          "a\xCC\x88", "\xF0\x9F\x91\x8B", "\xE4\xB8\xAD\xE6\x96\x87", "<|endoftext|>",
                                          "<tool_call>", "42", "!", "\t", "o\xCC\x82\xCC\xA3"};

std::string random_text(std::mt19937& rng, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += kPieces[rng() % kPieces.size()];
    return s;
}

// Offsets: same ids as encode(), in order, covering the text without gaps; where NFC changes nothing
// each token's bytes are exactly its range of the text.
void check_offsets(const Tokenizer& tok, uint32_t seed) {
    std::mt19937 rng(seed);
    for (int iter = 0; iter < 200; ++iter) {
        const std::string text = random_text(rng, 1 + static_cast<int>(rng() % 30));
        std::vector<int32_t> ids;
        std::vector<TokenOffset> off;
        tok.encode_with_offsets(text, ids, off, SpecialTokens::kRecognize);
        ASSERT_EQ(ids, tok.encode(text, SpecialTokens::kRecognize)) << text;
        ASSERT_EQ(off.size(), ids.size());
        uint32_t pos = 0;
        bool nfc_stable = true;
        std::string storage;
        for (std::size_t i = 0; i < off.size(); ++i) {
            ASSERT_LE(off[i].begin, pos) << "token " << i << " of '" << text << "' starts after a gap";
            ASSERT_GE(off[i].begin, i == 0 ? 0u : off[i - 1].begin) << text;
            ASSERT_LT(off[i].begin, off[i].end) << text;
            pos = std::max(pos, off[i].end);
        }
        EXPECT_EQ(pos, text.size()) << text;
        if (tok.normalizes_nfc()) {
            for (const char* mark : {"\xCC\x81", "\xCC\x88", "\xCC\x82"}) nfc_stable &= text.find(mark) == std::string::npos;
        }
        if (nfc_stable) {
            for (std::size_t i = 0; i < off.size(); ++i) {
                EXPECT_EQ(text.substr(off[i].begin, off[i].end - off[i].begin), tok.decode(std::span(&ids[i], 1)))
                    << "token " << i << " of '" << text << "'";
            }
        }
    }
}

TEST(ChatOffsets, TinyTokenizerTokensSpellTheirRanges) {
    test::TempDir dir;
    const Tokenizer tok = Tokenizer::load(test::write_tiny_tokenizer_json(dir.str(), {{"h", "e"}, {"l", "l"}, {"o", " "}}, false));
    check_offsets(tok, std::random_device{}());
}

TEST(ChatOffsets, QwenNfcTextMapsBackToTheOriginal) {
    QTRAIN_REQUIRE_QWEN_TOKENIZER(tok);
    ASSERT_TRUE(tok->normalizes_nfc());
    check_offsets(*tok, std::random_device{}());
    // "e" + combining acute composes to one character: its token(s) cover both original characters
    const std::string text = "x e\xCC\x81 y";
    std::vector<int32_t> ids;
    std::vector<TokenOffset> off;
    tok->encode_with_offsets(text, ids, off);
    bool covered = false;
    for (const auto& o : off) covered |= o.begin <= 2 && o.end >= 5;
    EXPECT_TRUE(covered) << "no token covers the composed e + U+0301";
}

TEST(ChatOffsets, ReferenceCorpusGivesHfIdsAndCoversEveryByte) {
    // HF's ids with every added token recognised (what a rendered chat is tokenized with)
    QTRAIN_REQUIRE_QWEN_TOKENIZER(tok);
    QTRAIN_REQUIRE_REFERENCE(docs);
    int checked = 0;
    for (std::size_t i = 0; i < docs->size(); ++i) {
        const RefDoc& d = (*docs)[i];
        if (utf8::valid_prefix(d.raw) != d.raw.size()) continue;  // (offsets take valid UTF-8 only)
        std::vector<int32_t> ids;
        std::vector<TokenOffset> off;
        tok->encode_with_offsets(d.raw, ids, off);
        ASSERT_EQ(ids, d.ids[1]) << "document " << i;
        uint32_t end = 0;
        for (const TokenOffset& o : off) {
            ASSERT_LE(o.begin, end) << "document " << i;
            end = std::max(end, o.end);
        }
        ASSERT_EQ(end, d.raw.size()) << "document " << i;
        ++checked;
    }
    EXPECT_GT(checked, 100);
}

TEST(ChatOffsets, Llama3TokensSpellTheirRanges) {
    // no normalizer, ignore_merges (whole-piece tokens), Llama 3's added tokens
    for (const char* name : {"llama3.2", "llama3"}) {
        QTRAIN_REQUIRE_LLAMA3_TOKENIZER(tok, name);
        check_offsets(*tok, std::random_device{}());
    }
}

TEST(ChatOffsets, InvalidUtf8IsRefused) {
    test::TempDir dir;
    const Tokenizer tok = Tokenizer::load(test::write_tiny_tokenizer_json(dir.str(), {}, false));
    std::vector<int32_t> ids;
    std::vector<TokenOffset> off;
    EXPECT_THROW(tok.encode_with_offsets("ab\xFF", ids, off), Error);
}

TEST(ChatMask, OverlapWithSpansMatchesBruteForce) {
    std::mt19937 rng(std::random_device{}());
    for (int iter = 0; iter < 500; ++iter) {
        std::vector<TokenOffset> off;
        uint32_t pos = 0;
        for (int i = 0, n = static_cast<int>(rng() % 40); i < n; ++i) {
            const uint32_t len = 1 + rng() % 4;
            off.push_back({pos, pos + len});
            pos += len;
        }
        std::vector<ByteSpan> spans;
        std::size_t at = rng() % 5;
        while (at < pos + 3 && spans.size() < 6) {
            const std::size_t len = rng() % 6;
            spans.emplace_back(at, at + len);
            at += len + 1 + rng() % 8;
        }
        const auto mask = mask_from_spans(off, spans);
        for (std::size_t i = 0; i < off.size(); ++i) {
            bool want = false;
            for (const auto& [b, e] : spans) want |= off[i].begin < e && b < off[i].end;
            ASSERT_EQ(mask[i], want ? 1 : 0) << "token " << i;
        }
    }
}

bool python_has_jinja2() {
    static const bool ok = std::system("python3 -c 'import jinja2' >/dev/null 2>&1") == 0;
    return ok;
}

#define REQUIRE_JINJA2() \
    if (!python_has_jinja2()) GTEST_SKIP() << "python3 with jinja2 is not installed (pip install jinja2)"

class ChatApp : public ::testing::Test {
protected:
    void SetUp() override {
        tokenizer_path_ = test::write_tiny_tokenizer_json(tok_dir_.str(), {{"h", "e"}, {"l", "l"}, {"o", " "}}, false);
        tok_ = std::make_unique<Tokenizer>(Tokenizer::load(tokenizer_path_));
    }
    RunResult run(const std::string& lines, const std::string& extra = "", const std::string& name = "c.jsonl") {
        write_file(in_.file(name), lines);
        return test::run_command(std::string(QTRAIN_TOKENIZE_EXE) + " --no-progress --chat --tokenizer=" + tokenizer_path_ +
                                 " --chat-template=" + QTRAIN_SOURCE_DIR + "/tests/tokenizer/data/tiny_chat.jinja --out-dir=" +
                                 out_.str() + " --input=" + in_.file(name) + " " + extra + " 2>&1");
    }
    test::TempDir tok_dir_, in_, out_;
    std::string tokenizer_path_;
    std::unique_ptr<Tokenizer> tok_;
};

TEST_F(ChatApp, AssistantTurnsThroughEndOfTurnAreTrained) {
    REQUIRE_JINJA2();
    const RunResult r = run(
        R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"},{"role":"assistant","content":"hello world"},{"role":"user","content":"again"},{"role":"assistant","content":"ok \u00e9"}]})"
        "\n"
        R"({"prompt":"x","completion":"y"})"
        "\n",
        "--end-of-turn='<|endoftext|>'");
    ASSERT_NE(r.exit_code, 0) << r.output;  // mixed formats in one file
    EXPECT_NE(r.output.find("c.jsonl:2: a prompt/completion record in a file of messages records (line 1)"),
              std::string::npos) << r.output;

    const RunResult ok = run(
        R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"},{"role":"assistant","content":"hello world"},{"role":"user","content":"again"},{"role":"assistant","content":"ok \u00e9"}]})"
        "\n\n"
        R"({"messages":[{"role":"user","content":"no reply"}]})"
        "\n",
        "--end-of-turn='<|endoftext|>'");
    ASSERT_EQ(ok.exit_code, 0) << ok.output;
    EXPECT_NE(ok.output.find("c.jsonl:3: no assistant message"), std::string::npos) << ok.output;
    EXPECT_NE(ok.output.find("1 conversations (2 records; skipped: 1 without an assistant message"), std::string::npos)
        << ok.output;
    const TokenFile f(out_.file("train.bin"));
    ASSERT_TRUE(f.has_masks());
    ASSERT_TRUE(f.has_document_starts());
    const std::string text =
        "system: be brief<|endoftext|>\nU: hello<|endoftext|>\nA: hello world<|endoftext|>\nU: again<|endoftext|>\n"
        "A: ok \xC3\xA9<|endoftext|>\n";
    std::vector<int32_t> ids;
    std::vector<TokenOffset> off;
    tok_->encode_with_offsets(text, ids, off);
    ASSERT_EQ(std::vector<int32_t>(f.tokens(), f.tokens() + f.size()), ids);
    // the trained bytes: each assistant content and its <|endoftext|>
    std::string trained;
    for (int64_t i = 0; i < f.size(); ++i) {
        if (f.mask(i)) trained += tok_->decode(std::span(&ids[i], 1));
        EXPECT_EQ(f.document_start(i), i == 0);
    }
    EXPECT_EQ(trained, "hello world<|endoftext|>ok \xC3\xA9<|endoftext|>");
    EXPECT_NE(ok.output.find("trained"), std::string::npos);

    // last-assistant: only the second turn; all: everything
    ASSERT_EQ(run(R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"},{"role":"assistant","content":"d"}]})",
                  "--end-of-turn='<|endoftext|>' --train-on=last-assistant").exit_code, 0);
    const TokenFile last(out_.file("train.bin"));
    std::string last_trained;
    for (int64_t i = 0; i < last.size(); ++i) {
        if (last.mask(i)) last_trained += tok_->decode(std::span(last.tokens() + i, 1));
    }
    EXPECT_EQ(last_trained, "d<|endoftext|>");
    ASSERT_EQ(run(R"({"prompt":"a","completion":"b"})", "--train-on=all").exit_code, 0);
    const TokenFile all(out_.file("train.bin"));
    for (int64_t i = 0; i < all.size(); ++i) EXPECT_TRUE(all.mask(i));
}

TEST_F(ChatApp, MaxTokensCutsAndSkipsConversationsWithNothingLeftToTrain) {
    REQUIRE_JINJA2();
    const std::string long_user = std::string(200, 'x');
    const RunResult r = run(R"({"messages":[{"role":"user","content":")" + long_user +
                                R"("},{"role":"assistant","content":"hi"}]})" "\n" +
                                R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":")" + long_user +
                                R"("}]})" "\n",
                            "--max-tokens=20");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("c.jsonl:1: no trained token within --max-tokens"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("1 conversations (2 records; skipped: 0 without an assistant message, 1 with no trained "
                            "token (beyond --max-tokens, or none); 1 cut at --max-tokens)"),
              std::string::npos)
        << r.output;
    const TokenFile f(out_.file("train.bin"));
    EXPECT_EQ(f.size(), 20);
}

TEST_F(ChatApp, BadRecordsNameFileAndLine) {
    REQUIRE_JINJA2();
    const std::string ok = R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]})";
    struct Case {
        std::string line, message;
    };
    for (const Case& c : std::vector<Case>{
             {R"({"text":"plain"})", "c.jsonl:2: the record has no 'messages' (nor 'prompt' and 'completion'); keys: text"},
             {R"({"messages":[{"role":"bot","content":"x"}]})", "c.jsonl:2: messages[0] has role 'bot'"},
             {R"({"messages":[{"role":"user","content":["x"]}]})", "c.jsonl:2: messages[0] (user): content must be a string, got list"},
             {R"({"messages":[{"role":"system","content":"fail"},{"role":"user","content":"x"},{"role":"assistant","content":"y"}]})",
              "c.jsonl:2: the chat template failed to render it: the system message says fail"},
             {R"({"messages": [)", "c.jsonl:2: not valid JSON"},
             {R"({"prompt":"x"})", "c.jsonl:2: a prompt/completion record needs both"},
         }) {
        const RunResult r = run(ok + "\n" + c.line + "\n");
        EXPECT_NE(r.exit_code, 0) << c.line;
        EXPECT_NE(r.output.find(c.message), std::string::npos) << c.line << "\n" << r.output;
    }
}

TEST_F(ChatApp, TemplateThatIsNotPrefixStableIsRefused) {
    REQUIRE_JINJA2();
    test::TempDir dir;
    // the generation prompt differs from how an assistant turn starts
    write_file(dir.file("t.jinja"), "{% for m in messages %}{{ m.role }}:{{ m.content }}|{% endfor %}"
                                    "{% if add_generation_prompt %}ASSISTANT>{% endif %}");
    write_file(in_.file("c.jsonl"), R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]})" "\n");
    const RunResult r = test::run_command(std::string(QTRAIN_TOKENIZE_EXE) + " --no-progress --chat --tokenizer=" +
                                          tokenizer_path_ + " --chat-template=" + dir.file("t.jinja") + " --out-dir=" +
                                          out_.str() + " --input=" + in_.file("c.jsonl") + " 2>&1");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("c.jsonl:1: the chat template is not prefix-stable"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("--chat-template=FILE with {% generation %} blocks"), std::string::npos) << r.output;
}

TEST_F(ChatApp, TemplateProblemsAreNamed) {
    REQUIRE_JINJA2();
    test::TempDir dir;
    write_file(dir.file("broken.jinja"), "{% for m in messages %}{{ m.content }");
    write_file(in_.file("c.jsonl"), R"({"prompt":"a","completion":"b"})" "\n");
    const std::string base = std::string(QTRAIN_TOKENIZE_EXE) + " --no-progress --chat --tokenizer=" + tokenizer_path_ +
                             " --out-dir=" + out_.str() + " --input=" + in_.file("c.jsonl");
    const RunResult broken = test::run_command(base + " --chat-template=" + dir.file("broken.jinja") + " 2>&1");
    EXPECT_NE(broken.exit_code, 0);
    EXPECT_NE(broken.output.find("the chat template does not compile"), std::string::npos) << broken.output;
    // the tiny tokenizer's directory has no tokenizer_config.json and no chat_template.jinja
    const RunResult none = test::run_command(base + " 2>&1");
    EXPECT_NE(none.exit_code, 0);
    EXPECT_NE(none.output.find("no chat template"), std::string::npos) << none.output;
    EXPECT_NE(none.output.find("--chat-template=FILE"), std::string::npos) << none.output;
    // a chat_template.jinja beside the tokenizer is found
    write_file(tok_dir_.file("chat_template.jinja"), "{% for m in messages %}{{ m.content }}<|endoftext|>{% endfor %}");
    const RunResult found = test::run_command(base + " --end-of-turn='<|endoftext|>' 2>&1");
    EXPECT_EQ(found.exit_code, 0) << found.output;
    EXPECT_NE(found.output.find("chat_template.jinja"), std::string::npos) << found.output;
}

TEST_F(ChatApp, MissingPythonSaysWhatToInstall) {
    const RunResult r = run(R"({"prompt":"a","completion":"b"})" "\n", "--python=/nonexistent/python3");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("needs Python 3 with jinja2"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("pip install jinja2"), std::string::npos) << r.output;
}

TEST_F(ChatApp, TemplateKwargsReachTheTemplateAndRecordsOverrideThem) {
    REQUIRE_JINJA2();
    const RunResult r = run(R"({"prompt":"a","completion":"b"})" "\n"
                            R"({"prompt":"c","completion":"d","chat_template_kwargs":{"greeting":"mine"}})" "\n",
                            R"(--chat-template-kwargs='{"greeting": "all"}' --end-of-turn='<|endoftext|>')");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const TokenFile f(out_.file("train.bin"));
    const std::string text = tok_->decode(std::span(f.tokens(), static_cast<std::size_t>(f.size())));
    EXPECT_EQ(text, "all\nU: a<|endoftext|>\nA: b<|endoftext|>\nmine\nU: c<|endoftext|>\nA: d<|endoftext|>\n");
    const RunResult reserved = run(R"({"prompt":"a","completion":"b","chat_template_kwargs":{"messages":[]}})" "\n");
    EXPECT_NE(reserved.exit_code, 0);
    EXPECT_NE(reserved.output.find("c.jsonl:1: 'chat_template_kwargs' may not set messages"), std::string::npos)
        << reserved.output;
    const RunResult bad = run(R"({"prompt":"a","completion":"b"})" "\n", "--chat-template-kwargs='[1]'");
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.output.find("--chat-template-kwargs: '[1]' is not a JSON object"), std::string::npos) << bad.output;
}

TEST_F(ChatApp, PythonWithoutJinja2SaysWhatToInstall) {
    REQUIRE_JINJA2();
    test::TempDir dir;
    // python3 without its site-packages (where jinja2 is)
    write_file(dir.file("python"), "#!/bin/sh\nexec python3 -S \"$@\"\n");
    std::filesystem::permissions(dir.file("python"), std::filesystem::perms::owner_all);
    if (std::system(("'" + dir.file("python") + "' -c 'import jinja2' 2>/dev/null").c_str()) == 0) {
        GTEST_SKIP() << "jinja2 is importable without site-packages here";
    }
    const RunResult r = run(R"({"prompt":"a","completion":"b"})" "\n", "--python=" + dir.file("python"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("has no jinja2"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("pip install jinja2"), std::string::npos) << r.output;
}

TEST_F(ChatApp, GenerationBlocksTrainExactlyWhatTheyEmit) {
    REQUIRE_JINJA2();
    test::TempDir dir;
    write_file(dir.file("g.jinja"),
               "{% for m in messages %}{% if m.role == 'assistant' %}A:{% generation %}{{ m.content }}!{% endgeneration %}"
               "{% else %}U:{{ m.content }}{% endif %}<|endoftext|>{% endfor %}");
    write_file(in_.file("c.jsonl"), R"({"messages":[{"role":"user","content":"hello"},{"role":"assistant","content":"world"}]})" "\n");
    const RunResult r = test::run_command(std::string(QTRAIN_TOKENIZE_EXE) + " --no-progress --chat --tokenizer=" +
                                          tokenizer_path_ + " --chat-template=" + dir.file("g.jinja") + " --out-dir=" +
                                          out_.str() + " --input=" + in_.file("c.jsonl") + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("{% generation %} blocks"), std::string::npos) << r.output;
    const TokenFile f(out_.file("train.bin"));
    std::string trained;
    for (int64_t i = 0; i < f.size(); ++i) {
        if (f.mask(i)) trained += tok_->decode(std::span(f.tokens() + i, 1));
    }
    EXPECT_EQ(trained, "world!");
}

}  // namespace
}  // namespace qtrain
