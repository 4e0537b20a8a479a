// `train --tokenizer`: output/ gets the HF tokenizer files of the data's tokenizer (so transformers
// and lm_eval load output/ as a whole model; tests/scripts/hf_tokenizer_export_check.py checks that with
// HF's own libraries), and a tokenizer that cannot be used fails before any training.
#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.h"
#include "tokenizer/tiny_tiktoken.h"
#include "tokenizer/tokenizer.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;
namespace fs = std::filesystem;

namespace {

// The fixture's model with room for the tiny tokenizer's 291 ids (the token files stay below 64).
void widen_vocab(const Fixture& f, int vocab) {
    std::string config = read_file(f.model_dir + "/config.json");
    const std::string from = "\"vocab_size\": 64";
    config.replace(config.find(from), from.size(), "\"vocab_size\": " + std::to_string(vocab));
    write_file(f.model_dir + "/config.json", config);
}

const std::string kText = "hello world, the thin hell <|endoftext|> <tool_call>";

}  // namespace

TEST(TrainCliTokenizer, TiktokenFlagPutsAHfTokenizerIntoTheOutput) {
    Fixture f;
    widen_vocab(f, 512);
    const std::string tiktoken = write_tiny_tiktoken(f.dir / "tiny.tiktoken", tiny_tiktoken_tokens());
    auto r = run_command(f.base_cmd("run") + " --steps=2 --eval-every-n-steps=0 --tokenizer=" + tiktoken);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "tokenizer files written: tokenizer.json, tokenizer_config.json"));
    ASSERT_TRUE(fs::exists(f.dir / "run/tokenizer.json"));
    ASSERT_TRUE(fs::exists(f.dir / "run/tokenizer_config.json"));
    EXPECT_TRUE(fs::exists(f.dir / "run/model.safetensors"));
    const Tokenizer source = Tokenizer::load(tiktoken);
    const Tokenizer exported = Tokenizer::load(f.dir / "run");
    EXPECT_EQ(exported.format(), TokenizerFormat::kHfJson);
    for (const SpecialTokens mode : {SpecialTokens::kAsText, SpecialTokens::kRecognize})
        EXPECT_EQ(exported.encode(kText, mode), source.encode(kText, mode));
    EXPECT_TRUE(Contains(read_file(f.dir / "run/log.jsonl"), "\"tokenizer\":\"" + tiktoken + "\""));
}

TEST(TrainCliTokenizer, TokenizerFlagWinsOverTheModelDirectorysFiles) {
    Fixture f;
    widen_vocab(f, 512);
    write_file(f.model_dir + "/tokenizer.json", "{\"not\": \"the tokenizer you asked for\"}");
    write_file(f.model_dir + "/generation_config.json", "{\"eos_token_id\": 0}");
    const std::string tiktoken = write_tiny_tiktoken(f.dir / "tiny.tiktoken", tiny_tiktoken_tokens());

    auto copied = run_command(f.base_cmd("plain") + " --steps=1 --eval-every-n-steps=0");
    ASSERT_EQ(copied.exit_code, 0) << copied.output;
    EXPECT_EQ(read_file(f.dir / "plain/tokenizer.json"), read_file(f.model_dir + "/tokenizer.json"));

    auto r = run_command(f.base_cmd("run") + " --steps=1 --eval-every-n-steps=0 --tokenizer=" + tiktoken);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Tokenizer::load(f.dir / "run").regular_vocab_size(), 256 + static_cast<int>(tiny_tiktoken_tokens().size()));
    EXPECT_TRUE(fs::exists(f.dir / "run/generation_config.json"));  // a model file, still copied
}

TEST(TrainCliTokenizer, UnusableTokenizerFailsBeforeTraining) {
    Fixture f;  // vocab_size 64: too small for any byte-level tokenizer
    const std::string tiktoken = write_tiny_tiktoken(f.dir / "tiny.tiktoken", tiny_tiktoken_tokens());
    write_file(f.dir / "broken.json", "{\"model\": 1");
    struct Case {
        std::string flag, expect;
    };
    const std::vector<Case> cases = {
        {f.dir / "no-such-tokenizer.json", "--tokenizer: '" + (f.dir / "no-such-tokenizer.json") + "' is neither"},
        {f.dir / "broken.json", "--tokenizer: " + (f.dir / "broken.json") + ": not a valid tokenizer.json"},
        {tiktoken, "--tokenizer: " + tiktoken + " has ids up to 290 but the model's vocab_size is 64"},
    };
    for (const Case& c : cases) {
        auto r = run_command(f.base_cmd("run") + " --steps=1 --tokenizer=" + c.flag);
        EXPECT_NE(r.exit_code, 0) << c.flag;
        EXPECT_TRUE(Contains(r.output, c.expect)) << c.flag;
        EXPECT_FALSE(Contains(r.output, "[T] step")) << c.flag;
        EXPECT_FALSE(fs::exists(f.dir / "run/log.jsonl")) << c.flag;  // nothing started
    }
}
