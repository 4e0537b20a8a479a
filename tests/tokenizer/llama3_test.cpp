// Llama 3's tokenizer.json: its split regex (\p{N}{1,3}), the BOS its post-processor adds, export,
// and the errors for what qtrain does not implement — on a tiny tokenizer in Llama 3's format that
// the tests write themselves (runs everywhere), and on Llama 3's real files
// (scripts/tokenizer_fetch_llama3.sh) against the ids of HF `tokenizers`
// (scripts/tokenizer_make_reference.py), skipped where those are absent.
#include <filesystem>
#include <functional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "reference_corpus.h"
#include "tokenizer/batch_encoder.h"
#include "tokenizer/hf_tokenizer_export.h"
#include "tokenizer/hf_tokenizer_writer.h"
#include "tokenizer_test_data.h"

namespace qtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::read_file;
using test::write_file;

const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"1", "2"}, {"12", "3"}, {"4", "5"}, {"h", "i"}, {" ", "hi"}, {"'", "S"}};

std::vector<std::string> spelled(const Tokenizer& tok, const std::vector<int32_t>& ids) {
    std::vector<std::string> out;
    for (int32_t id : ids) out.push_back(tok.decode(std::span(&id, 1)));
    return out;
}

using V = std::vector<std::string>;

TEST(Llama3Json, LoadsTheLlama3Pipeline) {
    test::TempDir dir;
    const Tokenizer tok = Tokenizer::load(test::write_tiny_llama3_tokenizer_json(dir.str(), kMerges));
    const int32_t base = 256 + static_cast<int32_t>(kMerges.size());
    EXPECT_EQ(&tok.split_pattern(), &kLlama3Split);
    EXPECT_FALSE(tok.normalizes_nfc());
    EXPECT_TRUE(tok.ignore_merges());
    EXPECT_EQ(tok.bos_id(), base);
    EXPECT_EQ(tok.token_id("<|begin_of_text|>"), base);
    EXPECT_EQ(tok.token_id("<|eot_id|>"), base + 9);
    EXPECT_EQ(tok.end_of_text(), "<|end_of_text|>");
    EXPECT_EQ(tok.vocab_size(), base + 10);
    // Numbers in pieces of up to three; encode() adds no BOS (HF's add_special_tokens=False).
    EXPECT_EQ(spelled(tok, tok.encode("1234567 hi'S")), (V{"123", "45", "6", "7", " hi", "'S"}));
    // Special tokens in the text: as text by default, recognised on request.
    EXPECT_EQ(tok.encode("<|eot_id|>", SpecialTokens::kRecognize), (std::vector<int32_t>{base + 9}));
    EXPECT_EQ(tok.encode("<|eot_id|>").size(), 10u);
    // No NFC: a decomposed é stays two characters.
    EXPECT_EQ(tok.decode(tok.encode("e\xcc\x81")), "e\xcc\x81");

    // The Qwen2 tiny tokenizer: no BOS, Qwen2's split, <|endoftext|>.
    const Tokenizer qwen = Tokenizer::load(test::write_tiny_tokenizer_json(dir.str(), kMerges, false));
    EXPECT_EQ(qwen.bos_id(), std::nullopt);
    EXPECT_EQ(&qwen.split_pattern(), &kQwen2Split);
    EXPECT_EQ(qwen.end_of_text(), "<|endoftext|>");
    EXPECT_EQ(spelled(qwen, qwen.encode("1234")), (V{"1", "2", "3", "4"}));  // one digit a piece
}

// Edits the tiny Llama 3 tokenizer.json and loads it.
class Llama3JsonErrors : public ::testing::Test {
protected:
    void SetUp() override {
        path_ = test::write_tiny_llama3_tokenizer_json(dir_.str(), kMerges);
        j_ = json::parse(read_file(path_));
    }
    std::string write(const json& j) {
        write_file(dir_.file("edited.json"), j.dump());
        return dir_.file("edited.json");
    }
    test::TempDir dir_;
    std::string path_;
    json j_;
};

TEST_F(Llama3JsonErrors, AnUnknownSplitRegexIsNamedWithTheFile) {
    json j = j_;
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = R"(\p{N}{1,2}|\p{L}+|\s+)";
    const std::string path = write(j);
    EXPECT_ERROR(Tokenizer::load(path), path + ": unsupported split regex \"\\\\p{N}{1,2}|\\\\p{L}+|\\\\s+\"");
    EXPECT_ERROR(Tokenizer::load(path), "Llama 3's");
    // GPT-2's pre-tokenizer (ByteLevel with its own regex) is not the Split + ByteLevel sequence.
    j = j_;
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    EXPECT_ERROR(Tokenizer::load(write(j)), "edited.json: unsupported pre_tokenizer");
}

TEST_F(Llama3JsonErrors, PostProcessorsThatAddOtherTokensAreRefused) {
    json& processors = j_["post_processor"]["processors"];
    json& templ = processors[1];
    auto load_with = [&](const std::function<void(json&)>& edit) {
        json j = j_;
        edit(j["post_processor"]["processors"][1]);
        return Tokenizer::load(write(j));
    };
    // $A then a token: an EOS the template would add.
    EXPECT_ERROR(load_with([](json& t) { t["single"].push_back(t["single"][0]); }),
                 "edited.json: unsupported post_processor");
    EXPECT_ERROR(load_with([](json& t) { t["single"].push_back(t["single"][0]); }), "a token after $A");
    EXPECT_ERROR(load_with([](json& t) { t["single"].insert(t["single"].begin(), t["single"][0]); }),
                 "more than one token before $A");
    EXPECT_ERROR(load_with([](json& t) { t["special_tokens"]["<|begin_of_text|>"]["ids"].push_back(1); }),
                 "exactly one id");
    EXPECT_ERROR(load_with([](json& t) { t["special_tokens"]["<|begin_of_text|>"]["ids"][0] = 999999; }),
                 "the post-processor's token id 999999 is not in the vocabulary");
    EXPECT_ERROR(load_with([](json& t) { t = {{"type", "BertProcessing"}, {"sep", {"x", 1}}, {"cls", {"y", 2}}}; }),
                 "type 'BertProcessing'");
    // Without the template: no BOS; the template alone: the same BOS as in the Sequence.
    json j = j_;
    j["post_processor"] = processors[0];
    EXPECT_EQ(Tokenizer::load(write(j)).bos_id(), std::nullopt);
    j["post_processor"] = nullptr;
    EXPECT_EQ(Tokenizer::load(write(j)).bos_id(), std::nullopt);
    j["post_processor"] = templ;
    EXPECT_EQ(Tokenizer::load(write(j)).bos_id(), Tokenizer::load(path_).bos_id());
}

TEST(Llama3Json, BatchEncoderPutsOneBosBeforeEachDocument) {
    test::TempDir dir;
    const Tokenizer tok = Tokenizer::load(test::write_tiny_llama3_tokenizer_json(dir.str(), kMerges));
    std::string big;
    for (int i = 0; i < 500; ++i) big += "hi 12345\nhi\n";
    std::vector<Document> docs(3);
    docs[0].text = "hi";
    docs[1].text = big;
    docs[2].text = "";
    docs[2].response = "123";
    BatchEncodeOptions options;
    options.threads = 2;
    options.chunk_bytes = 100;  // the big document in many pieces
    options.bos_id = *tok.bos_id();
    options.eos_id = *tok.token_id("<|end_of_text|>");
    BatchEncoder encoder(tok, options);
    const auto out = encoder.encode(docs, /*with_masks=*/true);
    for (std::size_t d = 0; d < docs.size(); ++d) {
        std::vector<int32_t> want = {options.bos_id};
        std::vector<uint8_t> mask = {0};
        tok.encode(docs[d].text, want);
        mask.resize(want.size(), 0);
        tok.encode(docs[d].response, want);
        want.push_back(options.eos_id);
        mask.resize(want.size(), 1);
        EXPECT_EQ(out[d].tokens, want) << d;
        EXPECT_EQ(out[d].mask, mask) << d;
    }
}

TEST(Llama3Json, ExportKeepsThePostProcessor) {
    test::TempDir src, out, lone;
    const std::string path = test::write_tiny_llama3_tokenizer_json(src.str(), kMerges);
    const Tokenizer tok = Tokenizer::load(path);
    // From a lone tokenizer.json: copied as it is, and a Llama 3 tokenizer_config.json beside it.
    EXPECT_EQ(export_hf_tokenizer(tok, out.str()), (std::vector<std::string>{"tokenizer.json", "tokenizer_config.json"}));
    EXPECT_EQ(read_file(out.file("tokenizer.json")), read_file(path));
    const json c = json::parse(read_file(out.file("tokenizer_config.json")));
    EXPECT_EQ(c["tokenizer_class"], "PreTrainedTokenizerFast");
    EXPECT_EQ(c["bos_token"], "<|begin_of_text|>");
    EXPECT_EQ(c["eos_token"], "<|end_of_text|>");
    EXPECT_EQ(c["added_tokens_decoder"].size(), 10u);
    EXPECT_FALSE(c.contains("pad_token"));
    const Tokenizer back = Tokenizer::load(out.str());
    EXPECT_EQ(back.bos_id(), tok.bos_id());
    EXPECT_EQ(&back.split_pattern(), &kLlama3Split);
    EXPECT_EQ(back.encode("hi 1234567"), tok.encode("hi 1234567"));

    // The Qwen2 tiny tokenizer's config is unchanged: Qwen2Tokenizer, no BOS.
    const Tokenizer qwen = Tokenizer::load(test::write_tiny_tokenizer_json(lone.str(), kMerges, false));
    const json q = json::parse(hf_tokenizer_config_json(qwen));
    EXPECT_EQ(q["tokenizer_class"], "Qwen2Tokenizer");
    EXPECT_TRUE(q["bos_token"].is_null());
}

// ------------------------------------------------------------------------------------------------
// Llama 3's real tokenizer.json files against HF `tokenizers`.

const std::vector<RefDoc>* llama3_reference(const std::string& name) { return reference(test::llama3_dir(name)); }

#define QTRAIN_REQUIRE_LLAMA3_REFERENCE(var, name)                                                \
    const std::vector<RefDoc>* var = llama3_reference(name);                                      \
    if (!var)                                                                                     \
    GTEST_SKIP() << "no " << test::llama3_dir(name)                                               \
                 << "/reference.bin: run scripts/tokenizer_make_reference.py (see its header)"

class Llama3Reference : public ::testing::TestWithParam<std::string> {};

TEST_P(Llama3Reference, GivesHfIdsInEveryMode) {
    QTRAIN_REQUIRE_LLAMA3_TOKENIZER(tok, GetParam());
    QTRAIN_REQUIRE_LLAMA3_REFERENCE(docs, GetParam());
    EXPECT_EQ(&tok->split_pattern(), &kLlama3Split);
    EXPECT_EQ(tok->regular_vocab_size(), 128000);
    for (int m = 0; m < 3; ++m) {
        int failures = 0;
        for (std::size_t i = 0; i < docs->size() && failures < 5; ++i) {
            const std::vector<int32_t> got = tok->encode((*docs)[i].raw, kModes[m]);
            if (got != (*docs)[i].ids[m]) {
                ++failures;
                ADD_FAILURE() << kModeNames[m] << ": document " << i << " ('" << (*docs)[i].raw.substr(0, 80)
                              << "'): " << got.size() << " vs HF's " << (*docs)[i].ids[m].size() << " ids";
            }
        }
    }
}

// HF's tokenizer(doc) is bos_ids + the ids (checked by the generator on every document); qtrain's
// BOS is the same, and the BatchEncoder (what `tokenize` runs) writes BOS + ids + EOS.
TEST_P(Llama3Reference, BosIsThePostProcessorsAndTokenizePutsItFirst) {
    QTRAIN_REQUIRE_LLAMA3_TOKENIZER(tok, GetParam());
    QTRAIN_REQUIRE_LLAMA3_REFERENCE(docs, GetParam());
    const std::string meta = test::llama3_dir(GetParam()) + "/reference.json";
    if (!fs::exists(meta)) GTEST_SKIP() << "no " << meta;
    const std::vector<int32_t> bos_ids = json::parse(read_file(meta))["bos_ids"];
    const std::vector<int32_t> ours = tok->bos_id() ? std::vector<int32_t>{*tok->bos_id()} : std::vector<int32_t>{};
    EXPECT_EQ(ours, bos_ids);
    if (GetParam() == "llama3.2") EXPECT_EQ(tok->bos_id(), 128000);

    BatchEncodeOptions options;
    options.threads = 2;
    options.chunk_bytes = 4096;
    options.special = SpecialTokens::kRecognize;
    options.bos_id = tok->bos_id().value_or(-1);
    options.eos_id = *tok->token_id("<|end_of_text|>");
    EXPECT_EQ(options.eos_id, 128001);
    EXPECT_EQ(tok->end_of_text(), "<|end_of_text|>");
    std::vector<Document> batch(docs->size());
    for (std::size_t i = 0; i < docs->size(); ++i) batch[i].text = (*docs)[i].raw;
    BatchEncoder encoder(*tok, options);
    const auto out = encoder.encode(batch, false);
    for (std::size_t i = 0; i < docs->size(); ++i) {
        std::vector<int32_t> want = bos_ids;
        want.insert(want.end(), (*docs)[i].ids[1].begin(), (*docs)[i].ids[1].end());
        want.push_back(options.eos_id);
        ASSERT_EQ(out[i].tokens, want) << "document " << i;
    }
}

TEST_P(Llama3Reference, DecodeGivesTheText) {
    QTRAIN_REQUIRE_LLAMA3_TOKENIZER(tok, GetParam());
    QTRAIN_REQUIRE_LLAMA3_REFERENCE(docs, GetParam());
    for (std::size_t i = 0; i < docs->size(); ++i) {
        ASSERT_EQ(tok->decode((*docs)[i].ids[2]), (*docs)[i].normalized) << "document " << i;
    }
}

TEST_P(Llama3Reference, ParallelChunksGiveTheIdsOfTheWholeText) {
    QTRAIN_REQUIRE_LLAMA3_TOKENIZER(tok, GetParam());
    QTRAIN_REQUIRE_LLAMA3_REFERENCE(docs, GetParam());
    std::string all;
    for (const RefDoc& d : *docs) all += d.raw + "\n";
    const std::vector<int32_t> whole = tok->encode(all);
    const auto chunks = tok->split_for_parallel(all, 1000);
    EXPECT_GT(chunks.size(), 100u);
    std::vector<int32_t> joined;
    for (const std::string_view c : chunks) tok->encode(c, joined);
    EXPECT_EQ(joined, whole);
}

TEST_P(Llama3Reference, ExportCopiesTheFilesAndKeepsTheBos) {
    QTRAIN_REQUIRE_LLAMA3_TOKENIZER(tok, GetParam());
    test::TempDir out;
    const auto files = export_hf_tokenizer(*tok, out.str());
    EXPECT_EQ(files[0], "tokenizer.json");
    for (const std::string& f : files) {
        if (fs::exists(test::llama3_dir(GetParam()) + "/" + f)) {
            EXPECT_EQ(read_file(out.file(f)), read_file(test::llama3_dir(GetParam()) + "/" + f)) << f;
        }
    }
    const Tokenizer back = Tokenizer::load(out.str());
    EXPECT_EQ(back.bos_id(), tok->bos_id());
    EXPECT_EQ(back.vocab_size(), tok->vocab_size());
}

INSTANTIATE_TEST_SUITE_P(RealFiles, Llama3Reference, ::testing::Values("llama3.2", "llama3"),
                         [](const auto& info) { return info.param == "llama3.2" ? "Llama3_2" : "Llama3"; });

// Both tokenizer.json files spell the vocabulary of Meta's own tiktoken file (llama-models), rank for
// id, and share their merges.
TEST(Llama3Files, VocabularyIsMetasTiktokenRanks) {
    QTRAIN_REQUIRE_LLAMA3_TOKENIZER(v32, "llama3.2");
    QTRAIN_REQUIRE_LLAMA3_TOKENIZER(v3, "llama3");
    const std::string model = test::llama3_dir("llama3") + "/tokenizer.model";
    if (!fs::exists(model)) GTEST_SKIP() << "no " << model << ": run scripts/tokenizer_fetch_llama3.sh";
    const Tokenizer meta = Tokenizer::from_tiktoken(model);
    ASSERT_EQ(meta.regular_vocab_size(), 128000);
    ASSERT_EQ(v32->regular_vocab_size(), 128000);
    ASSERT_EQ(v3->regular_vocab_size(), 128000);
    for (int32_t id = 0; id < 128000; ++id) {
        const std::string bytes = meta.bpe().token(id);
        ASSERT_EQ(v32->bpe().token(id), bytes) << id;
        ASSERT_EQ(v3->bpe().token(id), bytes) << id;
    }
    EXPECT_EQ(v32->num_merges(), v3->num_merges());
    EXPECT_FALSE(v32->ignore_merges());
    EXPECT_TRUE(v3->ignore_merges());
    EXPECT_EQ(v32->bos_id(), 128000);
    EXPECT_EQ(v3->bos_id(), std::nullopt);  // the first release's post-processor adds nothing
    for (const char* t : {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}) {
        EXPECT_EQ(v32->token_id(t), v3->token_id(t)) << t;
    }
    EXPECT_EQ(v32->token_id("<|image|>"), 128256);
}

}  // namespace
}  // namespace qtrain
