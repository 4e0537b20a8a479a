// build/tokenize end to end: small inputs -> token files read back with qtrain::TokenFile. Uses the
// tiny tokenizer.json the tests write themselves (so it runs everywhere), plus the real Qwen2.5
// tokenizer where ../shared data is present.
#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "io/token_file.h"
#include "tokenizer_test_data.h"

namespace qtrain {
namespace {

namespace fs = std::filesystem;

using test::RunResult;
using test::write_file;

// Runs the tokenize app (stdout and stderr in .output).
RunResult run_tokenize(const std::string& args, const std::string& env = "") {
    return test::run_command(env + " " + QTRAIN_TOKENIZE_EXE + " --no-progress " + args);
}

std::vector<int32_t> tokens_of(const TokenFile& f) { return {f.tokens(), f.tokens() + f.size()}; }

class TokenizeApp : public ::testing::Test {
protected:
    void SetUp() override {
        tokenizer_path_ = test::write_tiny_tokenizer_json(tok_dir_.str(), {{"h", "e"}, {"l", "l"}, {"o", " "}}, false);
        tok_ = std::make_unique<Tokenizer>(Tokenizer::load(tokenizer_path_));
        eos_ = *tok_->token_id("<|endoftext|>");
    }
    // The ids tokenize must write for these documents, in order.
    std::vector<int32_t> expected(const std::vector<std::string>& docs) const {
        std::vector<int32_t> ids;
        for (const std::string& d : docs) {
            tok_->encode(d, ids);
            ids.push_back(eos_);
        }
        return ids;
    }
    std::string args(const std::string& rest) const {
        return "--tokenizer=" + tokenizer_path_ + " --out-dir=" + out_.str() + " " + rest;
    }

    test::TempDir tok_dir_, in_, out_;
    std::string tokenizer_path_;
    std::unique_ptr<Tokenizer> tok_;
    int32_t eos_ = -1;
};

TEST_F(TokenizeApp, OneDocumentPerTextFileWithEos) {
    write_file(in_.file("a.txt"), "hello world\n");
    write_file(in_.file("b.txt"), "second <|endoftext|> file");
    const RunResult r = run_tokenize(args("--input=" + in_.str() + "/*.txt --threads=2"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("2 documents"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("MB/s"), std::string::npos) << r.output;
    const TokenFile f(out_.file("train.bin"));
    EXPECT_EQ(tokens_of(f), expected({"hello world\n", "second <|endoftext|> file"}));
    EXPECT_EQ(f.header().vocab_size, tok_->vocab_size());
    EXPECT_FALSE(f.has_masks());
    EXPECT_FALSE(fs::exists(out_.file("eval.bin")));
}

TEST_F(TokenizeApp, DocumentSeparators) {
    write_file(in_.file("t.txt"), "para one\nstill one\n\n \npara two\r\nline\n\nthree");
    ASSERT_EQ(run_tokenize(args("--input=" + in_.file("t.txt") + " --doc-separator=blank-line")).exit_code, 0);
    EXPECT_EQ(tokens_of(TokenFile(out_.file("train.bin"))),
              expected({"para one\nstill one", "para two\r\nline", "three"}));

    ASSERT_EQ(run_tokenize(args("--input=" + in_.file("t.txt") + " --doc-separator=line")).exit_code, 0);
    EXPECT_EQ(tokens_of(TokenFile(out_.file("train.bin"))),
              expected({"para one", "still one", " ", "para two", "line", "three"}));

    write_file(in_.file("s.txt"), "story one<|endoftext|>story two\n<|endoftext|>");
    ASSERT_EQ(run_tokenize(args("--input=" + in_.file("s.txt") + " '--doc-separator=<|endoftext|>'")).exit_code, 0);
    EXPECT_EQ(tokens_of(TokenFile(out_.file("train.bin"))), expected({"story one", "story two\n"}));
}

TEST_F(TokenizeApp, EvalSplitTakesWholeDocumentsFromTheStart) {
    std::vector<std::string> docs;
    std::string text;
    for (int i = 0; i < 20; ++i) {
        docs.push_back("document number " + std::to_string(i) + " hello");
        text += docs.back() + "\n";
    }
    write_file(in_.file("d.txt"), text);
    ASSERT_EQ(run_tokenize(args("--input=" + in_.file("d.txt") + " --doc-separator=line --eval-tokens=50")).exit_code, 0);
    const auto eval = tokens_of(TokenFile(out_.file("eval.bin")));
    const auto train = tokens_of(TokenFile(out_.file("train.bin")));
    std::size_t n_eval = 0;
    while (expected(std::vector<std::string>(docs.begin(), docs.begin() + n_eval)).size() < 50) ++n_eval;
    EXPECT_EQ(eval, expected(std::vector<std::string>(docs.begin(), docs.begin() + n_eval)));
    EXPECT_EQ(train, expected(std::vector<std::string>(docs.begin() + n_eval, docs.end())));

    ASSERT_EQ(run_tokenize(args("--input=" + in_.file("d.txt") + " --doc-separator=line --eval-fraction=0.25")).exit_code,
              0);
    // Documents starting in the first 25% of the bytes: 5 of 20 equal-ish lines (0..4 start below).
    std::size_t offset = 0, k = 0;
    while (offset < text.size() / 4) offset += docs[k++].size() + 1;
    EXPECT_EQ(tokens_of(TokenFile(out_.file("eval.bin"))),
              expected(std::vector<std::string>(docs.begin(), docs.begin() + k)));
}

// A corpus of known parts splits at a part: the demo's eval set is exactly its first book.
TEST_F(TokenizeApp, EvalDocumentsTakesExactlyTheFirstN) {
    std::vector<std::string> docs;
    std::string text;
    for (int i = 0; i < 12; ++i) {
        docs.push_back("book " + std::to_string(i) + (i == 0 ? " is much longer than the others, hello hello" : ""));
        text += docs.back() + "\n\n";
    }
    write_file(in_.file("d.txt"), text);
    const RunResult r = run_tokenize(args("--input=" + in_.file("d.txt") + " --doc-separator=blank-line --eval-documents=1"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(tokens_of(TokenFile(out_.file("eval.bin"))), expected({docs[0]}));
    EXPECT_EQ(tokens_of(TokenFile(out_.file("train.bin"))), expected(std::vector<std::string>(docs.begin() + 1, docs.end())));

    ASSERT_EQ(run_tokenize(args("--input=" + in_.file("d.txt") + " --doc-separator=blank-line --eval-documents=5")).exit_code, 0);
    EXPECT_EQ(tokens_of(TokenFile(out_.file("eval.bin"))), expected(std::vector<std::string>(docs.begin(), docs.begin() + 5)));

    for (const char* other : {" --eval-tokens=10", " --eval-fraction=0.1"}) {
        const RunResult both = run_tokenize(args("--input=" + in_.file("d.txt") + " --eval-documents=1" + other));
        EXPECT_NE(both.exit_code, 0) << other;
        EXPECT_NE(both.output.find("--eval-documents"), std::string::npos) << both.output;
    }
    const RunResult zero = run_tokenize(args("--input=" + in_.file("d.txt") + " --eval-documents=0"));
    EXPECT_NE(zero.exit_code, 0);
    EXPECT_NE(zero.output.find("--eval-documents"), std::string::npos) << zero.output;
}

TEST_F(TokenizeApp, JsonLinesTextAndMasks) {
    write_file(in_.file("d.jsonl"),
               "{\"text\": \"hello one\", \"meta\": {\"body\": \"nested\"}}\n\n{\"text\": \"two\"}\n");
    ASSERT_EQ(run_tokenize(args("--input=" + in_.file("d.jsonl"))).exit_code, 0);
    EXPECT_EQ(tokens_of(TokenFile(out_.file("train.bin"))), expected({"hello one", "two"}));

    write_file(in_.file("p.jsonl"), "{\"q\": \"hello?\", \"a\": \"world\"}\n{\"q\": \"x\", \"a\": \"yo\"}\n");
    ASSERT_EQ(run_tokenize(args("--input=" + in_.file("p.jsonl") + " --prompt-field=q --response-field=a")).exit_code, 0);
    const TokenFile f(out_.file("train.bin"));
    ASSERT_TRUE(f.has_masks());
    std::vector<int32_t> want;
    std::vector<bool> mask;
    for (const auto& [q, a] : std::vector<std::pair<std::string, std::string>>{{"hello?", "world"}, {"x", "yo"}}) {
        const auto qi = tok_->encode(q), ai = tok_->encode(a);
        want.insert(want.end(), qi.begin(), qi.end());
        mask.insert(mask.end(), qi.size(), false);
        want.insert(want.end(), ai.begin(), ai.end());
        mask.insert(mask.end(), ai.size(), true);
        want.push_back(eos_);
        mask.push_back(true);
    }
    EXPECT_EQ(tokens_of(f), want);
    for (int64_t i = 0; i < f.size(); ++i) EXPECT_EQ(f.mask(i), mask[i]) << i;
}

TEST_F(TokenizeApp, ShardsAndStaleFiles) {
    std::string text;
    std::vector<std::string> lines;
    for (int i = 0; i < 30; ++i) {
        lines.push_back("hello hello hello " + std::to_string(i));
        text += lines.back() + "\n";
    }
    write_file(in_.file("d.txt"), text);
    write_file(out_.file("train-099.bin"), "left over");
    ASSERT_EQ(run_tokenize(args("--input=" + in_.file("d.txt") + " --doc-separator=line --shard-tokens=40")).exit_code, 0);
    EXPECT_FALSE(fs::exists(out_.file("train-099.bin")));
    EXPECT_FALSE(fs::exists(out_.file("train.bin")));
    std::vector<int32_t> all;
    int shards = 0;
    for (; fs::exists(out_.file(fmt::format("train-{:03d}.bin", shards))); ++shards) {
        const auto t = tokens_of(TokenFile(out_.file(fmt::format("train-{:03d}.bin", shards))));
        EXPECT_EQ(t.back(), eos_);  // shards end at document boundaries
        all.insert(all.end(), t.begin(), t.end());
    }
    EXPECT_GT(shards, 3);
    EXPECT_EQ(all, expected(lines));
}

TEST_F(TokenizeApp, ClearErrors) {
    RunResult r = run_tokenize(args("--input=" + in_.file("missing.txt")));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("missing.txt"), std::string::npos) << r.output;

    write_file(in_.file("a.txt"), "x");
    r = run_tokenize("--tokenizer=" + in_.file("no-such-tokenizer.json") + " --input=" + in_.file("a.txt") +
                     " --out-dir=" + out_.str());
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("no-such-tokenizer.json"), std::string::npos) << r.output;

    write_file(in_.file("bad.jsonl"), "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
    r = run_tokenize(args("--input=" + in_.file("bad.jsonl")));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("bad.jsonl:2: no field 'text' (top-level fields: body)"), std::string::npos) << r.output;

    r = run_tokenize(args("--dataset=no-such-set"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("tiny-shakespeare"), std::string::npos) << r.output;
}

// Runs that would leave no training data are errors naming the input and the count, and write
// nothing: the token files of an earlier run in --out-dir stay as they were (issue 29).
TEST_F(TokenizeApp, NoTrainingDataIsAnErrorThatWritesNothing) {
    write_file(in_.file("good.txt"), "hello\n\nworld\n\nagain\n");
    ASSERT_EQ(run_tokenize(args("--input=" + in_.file("good.txt") + " --doc-separator=blank-line")).exit_code, 0);
    const auto before = tokens_of(TokenFile(out_.file("train.bin")));

    write_file(in_.file("empty.txt"), "");
    RunResult r = run_tokenize(args("--input=" + in_.file("empty.txt")));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("no documents in --input (1 file, 0 bytes): the input is empty"), std::string::npos)
        << r.output;

    write_file(in_.file("blank.jsonl"), "\n\n");
    r = run_tokenize(args("--input=" + in_.file("blank.jsonl")));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("no documents in --input (1 file, 2 bytes)"), std::string::npos) << r.output;

    r = run_tokenize(args("--input=" + in_.file("good.txt") + " --doc-separator=blank-line --eval-documents=3"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("--eval-documents=3 took all 3 documents"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("leaving none for train.bin"), std::string::npos) << r.output;
    r = run_tokenize(args("--input=" + in_.file("good.txt") + " --doc-separator=blank-line --eval-documents=50"));
    EXPECT_NE(r.output.find("--eval-documents=50 took all 3 documents"), std::string::npos) << r.output;
    r = run_tokenize(args("--input=" + in_.file("good.txt") + " --doc-separator=blank-line --eval-fraction=1"));
    EXPECT_NE(r.output.find("--eval-fraction=1 took all 3 documents"), std::string::npos) << r.output;

    EXPECT_EQ(tokens_of(TokenFile(out_.file("train.bin"))), before);
    EXPECT_FALSE(fs::exists(out_.file("eval.bin")));
    // one fewer is fine
    r = run_tokenize(args("--input=" + in_.file("good.txt") + " --doc-separator=blank-line --eval-documents=2"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(tokens_of(TokenFile(out_.file("train.bin"))), expected({"again"}));
}

// A literal --doc-separator that never occurs (a typo of a keyword: blankline) would make each file
// one document; it is an error naming the keywords.
TEST_F(TokenizeApp, ALiteralSeparatorThatNeverOccursIsAnError) {
    write_file(in_.file("a.txt"), "one\n\ntwo\n\nthree\n");
    write_file(in_.file("b.txt"), "four\n\nfive\n");
    for (const char* typo : {"blankline", "lines"}) {
        const RunResult r = run_tokenize(args("--input='" + in_.str() + "/*.txt' --doc-separator=" + typo));
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_NE(r.output.find(fmt::format("--doc-separator='{}' never occurs in the 2 text files", typo)),
                  std::string::npos)
            << r.output;
        EXPECT_NE(r.output.find("the keywords are none (a file is a document), line and blank-line"), std::string::npos)
            << r.output;
        EXPECT_FALSE(fs::exists(out_.file("train.bin")));
    }
    // a literal found in one file of the two is used as it is
    write_file(in_.file("b.txt"), "four ## five");
    const RunResult ok = run_tokenize(args("--input='" + in_.str() + "/*.txt' '--doc-separator= ## '"));
    ASSERT_EQ(ok.exit_code, 0) << ok.output;
    EXPECT_EQ(tokens_of(TokenFile(out_.file("train.bin"))), expected({"one\n\ntwo\n\nthree\n", "four", "five"}));
}

TEST_F(TokenizeApp, ADirectoryAsInputIsNamedAsOne) {
    fs::create_directories(in_.file("texts"));
    const RunResult r = run_tokenize(args("--input=" + in_.file("texts")));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("--input: '" + in_.file("texts") + "' is a directory, not a file"), std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("no file matches"), std::string::npos) << r.output;
}

TEST_F(TokenizeApp, NamedDatasetFromTheDownloadDirectoryOrAClearError) {
    // Without the file and without curl: the error names the URL and where to put the file.
    const RunResult r =
        run_tokenize(args("--dataset=tiny-shakespeare --download-dir=" + in_.str()), "PATH=/nonexistent");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("https://raw.githubusercontent.com/karpathy/char-rnn"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(in_.file("tiny-shakespeare.txt")), std::string::npos) << r.output;

    // With the file in place no network is needed; speeches are blank-line separated, 10% eval.
    std::string text;
    for (int i = 0; i < 40; ++i) text += "Speaker " + std::to_string(i) + ":\nhello there.\n\n";
    write_file(in_.file("tiny-shakespeare.txt"), text);
    const RunResult ok = run_tokenize(args("--dataset=tiny-shakespeare --download-dir=" + in_.str()));
    ASSERT_EQ(ok.exit_code, 0) << ok.output;
    EXPECT_NE(ok.output.find("40 documents"), std::string::npos) << ok.output;
    EXPECT_TRUE(fs::exists(out_.file("eval.bin")));
    EXPECT_TRUE(fs::exists(out_.file("train.bin")));
}

TEST(TokenizeAppQwen, EndOfTextIs151643AndIdsMatchTheLibrary) {
    QTRAIN_REQUIRE_QWEN_TOKENIZER(tok);
    test::TempDir in, out;
    const std::string docs[] = {"Hello, world! 你好，世界。", "def f(x):\r\n    return x ** 2  # 🙂\n"};
    write_file(in.file("a.txt"), docs[0]);
    write_file(in.file("b.txt"), docs[1]);
    const RunResult r = run_tokenize("--tokenizer=" + test::qwen_tokenizer_json() + " --input=" + in.str() +
                                     "/*.txt --out-dir=" + out.str());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const TokenFile f(out.file("train.bin"));
    std::vector<int32_t> want;
    for (const std::string& d : docs) {
        tok->encode(d, want);
        want.push_back(151643);
    }
    EXPECT_EQ(tokens_of(f), want);
    EXPECT_EQ(f.header().vocab_size, 151665);
}

// A tokenizer whose post-processor adds a BOS (Llama 3's format): each document is <|begin_of_text|>,
// its ids, then <|end_of_text|> (the default --eos for a tokenizer without <|endoftext|>), as HF's
// tokenizer(doc) plus the EOS; a large document cut for the threads still gets one BOS.
TEST(TokenizeAppLlama3, BosBeforeAndEndOfTextAfterEachDocument) {
    test::TempDir tok_dir, in, out;
    const std::string path = test::write_tiny_llama3_tokenizer_json(tok_dir.str(), {{"1", "2"}, {"12", "3"}, {"h", "i"}});
    const Tokenizer tok = Tokenizer::load(path);
    const int32_t bos = *tok.token_id("<|begin_of_text|>"), eot = *tok.token_id("<|end_of_text|>");
    ASSERT_EQ(tok.bos_id(), bos);
    std::string big;
    for (int i = 0; i < 80000; ++i) big += "hi 1234567\nhi\n";  // over 1 MB: cut for the threads
    const std::vector<std::string> docs = {"hi 123456", big, "x"};
    for (std::size_t i = 0; i < docs.size(); ++i) write_file(in.file(fmt::format("{}.txt", i)), docs[i]);
    auto want = [&](bool with_bos, int32_t end) {
        std::vector<int32_t> ids;
        for (const std::string& d : docs) {
            if (with_bos) ids.push_back(bos);
            tok.encode(d, ids);
            if (end >= 0) ids.push_back(end);
        }
        return ids;
    };
    const std::string base = "--tokenizer=" + path + " --input=" + in.str() + "/*.txt --out-dir=" + out.str() + " --threads=2";
    RunResult r = run_tokenize(base);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(fmt::format("BOS <|begin_of_text|> = {}; EOS <|end_of_text|> = {}", bos, eot)),
              std::string::npos) << r.output;
    EXPECT_EQ(tokens_of(TokenFile(out.file("train.bin"))), want(true, eot));
    EXPECT_EQ(tokens_of(TokenFile(out.file("train.bin")))[1], *tok.token_id("hi"));

    r = run_tokenize(base + " --bos=none --eos=none");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(tokens_of(TokenFile(out.file("train.bin"))), want(false, -1));
    r = run_tokenize(base + " --eos='<|eot_id|>'");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(tokens_of(TokenFile(out.file("train.bin"))), want(true, *tok.token_id("<|eot_id|>")));
    r = run_tokenize(base + " --bos='<|nope|>'");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("--bos: '<|nope|>' is not a token of " + path), std::string::npos) << r.output;

    // With prompt and response, the BOS belongs to the prompt (mask 0).
    write_file(in.file("p.jsonl"), "{\"q\": \"hi?\", \"a\": \"123\"}\n");
    r = run_tokenize("--tokenizer=" + path + " --input=" + in.file("p.jsonl") + " --out-dir=" + out.str() +
                     " --prompt-field=q --response-field=a");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const TokenFile f(out.file("train.bin"));
    std::vector<int32_t> ids = {bos};
    tok.encode("hi?", ids);
    const std::size_t prompt = ids.size();
    tok.encode("123", ids);
    ids.push_back(eot);
    ASSERT_EQ(tokens_of(f), ids);
    for (int64_t i = 0; i < f.size(); ++i) EXPECT_EQ(f.mask(i), i >= static_cast<int64_t>(prompt)) << i;
}

TEST(TokenizeAppQwen, NoBos) {
    test::TempDir tok_dir, in, out;
    const std::string path = test::write_tiny_tokenizer_json(tok_dir.str(), {{"h", "i"}}, false);
    write_file(in.file("a.txt"), "hi");
    const RunResult r = run_tokenize("--tokenizer=" + path + " --input=" + in.file("a.txt") + " --out-dir=" + out.str());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("BOS none; EOS <|endoftext|> = 257"), std::string::npos) << r.output;
    EXPECT_EQ(tokens_of(TokenFile(out.file("train.bin"))), (std::vector<int32_t>{256, 257}));
}

}  // namespace
}  // namespace qtrain
