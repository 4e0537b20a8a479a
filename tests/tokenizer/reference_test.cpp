// The tokenizer against HF `tokenizers` on the generated corpus (scripts/tokenizer_make_reference.py):
// exact ids in all three special-token modes, for tokenizer.json and for qwen.tiktoken.
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "reference_corpus.h"
#include "tokenizer_test_data.h"

namespace qtrain {
namespace {

std::string escaped(std::string_view s, std::size_t max = 120) {
    std::string out;
    for (std::size_t i = 0; i < s.size() && i < max; ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7F && c != '\\') {
            out += static_cast<char>(c);
        } else {
            out += fmt::format("\\x{:02x}", c);
        }
    }
    return s.size() > max ? out + "..." : out;
}

std::string describe_mismatch(const Tokenizer& tok, const RefDoc& d, std::size_t index,
                              const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
    std::size_t k = 0;
    while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
    auto around = [&](const std::vector<int32_t>& ids) {
        std::string s;
        for (std::size_t i = k >= 3 ? k - 3 : 0; i < std::min(ids.size(), k + 4); ++i) {
            s += fmt::format("{}{}='{}' ", i == k ? "*" : "", ids[i],
                             escaped(tok.decode(std::span(&ids[i], 1)), 20));
        }
        return s;
    };
    return fmt::format("document {} ({} bytes) '{}': {} vs {} ids, first difference at {}\n  qtrain: {}\n  HF:     {}",
                       index, d.raw.size(), escaped(d.raw), got.size(), want.size(), k,
                       around(got), around(want));
}

void expect_reference_ids(const Tokenizer& tok, const std::vector<RefDoc>& docs) {
    for (int m = 0; m < 3; ++m) {
        int failures = 0;
        for (std::size_t i = 0; i < docs.size() && failures < 5; ++i) {
            const std::vector<int32_t> got = tok.encode(docs[i].raw, kModes[m]);
            if (got != docs[i].ids[m]) {
                ++failures;
                ADD_FAILURE() << kModeNames[m] << ": "
                              << describe_mismatch(tok, docs[i], i, got, docs[i].ids[m]);
            }
        }
    }
}

TEST(TokenizerReference, JsonGivesHfIdsInEveryMode) {
    QTRAIN_REQUIRE_QWEN_TOKENIZER(tok);
    QTRAIN_REQUIRE_REFERENCE(docs);
    expect_reference_ids(*tok, *docs);
}

TEST(TokenizerReference, DecodeGivesTheNormalizedText) {
    QTRAIN_REQUIRE_QWEN_TOKENIZER(tok);
    QTRAIN_REQUIRE_REFERENCE(docs);
    for (std::size_t i = 0; i < docs->size(); ++i) {
        const RefDoc& d = (*docs)[i];
        ASSERT_EQ(tok->decode(d.ids[2]), d.normalized) << "document " << i;
    }
}

TEST(TokenizerReference, ThreadsGiveTheSameIds) {
    QTRAIN_REQUIRE_QWEN_TOKENIZER(tok);
    QTRAIN_REQUIRE_REFERENCE(docs);
    std::vector<std::vector<int32_t>> got(docs->size());
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
        threads.emplace_back([&, t] {
            for (std::size_t i = t; i < docs->size(); i += 3) got[i] = tok->encode((*docs)[i].raw);
        });
    }
    for (auto& th : threads) th.join();
    for (std::size_t i = 0; i < docs->size(); ++i) ASSERT_EQ(got[i], (*docs)[i].ids[0]) << i;
}

TEST(TokenizerReference, ParallelChunksGiveTheIdsOfTheWholeText) {
    QTRAIN_REQUIRE_QWEN_TOKENIZER(tok);
    QTRAIN_REQUIRE_REFERENCE(docs);
    std::string all;
    for (const RefDoc& d : *docs) all += d.raw + "\n";
    for (const SpecialTokens mode : kModes) {
        const std::vector<int32_t> whole = tok->encode(all, mode);
        for (const std::size_t chunk : {std::size_t{1}, std::size_t{1000}, std::size_t{65536}}) {
            const auto chunks = tok->split_for_parallel(all, chunk);
            if (chunk == 1000) EXPECT_GT(chunks.size(), 100u);
            std::vector<int32_t> joined;
            std::size_t bytes = 0;
            for (const std::string_view c : chunks) {
                tok->encode(c, joined, mode);
                bytes += c.size();
            }
            EXPECT_EQ(bytes, all.size());
            EXPECT_EQ(joined, whole) << "chunk size " << chunk;
        }
    }
}

TEST(TokenizerReference, TiktokenHasTheSameTokensAndIds) {
    QTRAIN_REQUIRE_QWEN_TOKENIZER(json_tok);
    const std::string path = test::reference_dir() + "/qwen.tiktoken";
    if (!std::filesystem::exists(path)) {
        GTEST_SKIP() << "no " << path << ": run scripts/tokenizer_fetch_tiktoken.sh";
    }
    const Tokenizer tok = Tokenizer::load(path);
    ASSERT_EQ(tok.regular_vocab_size(), json_tok->regular_vocab_size());
    ASSERT_EQ(tok.vocab_size(), json_tok->vocab_size());
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
        ASSERT_EQ(tok.decode(std::span(&id, 1)), json_tok->decode(std::span(&id, 1))) << "id " << id;
    }
    for (const AddedToken& t : json_tok->added_tokens()) EXPECT_EQ(tok.token_id(t.content), t.id);
    const std::vector<RefDoc>* docs = reference();
    if (docs) expect_reference_ids(tok, *docs);
}

}  // namespace
}  // namespace qtrain
