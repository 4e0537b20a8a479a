// Where the tokenizer tests find their inputs, and a tiny tokenizer they can build themselves.
//  - The real Qwen2.5 tokenizer.json: ../shared/data (beside a developer's checkout only).
//  - The reference ids from HF `tokenizers` and qwen.tiktoken: generated at test time into
//    $QTRAIN_TOKENIZER_REFERENCE_DIR, else <build dir>/tokenizer-reference, by
//    scripts/tokenizer_make_reference.py and scripts/tokenizer_fetch_tiktoken.sh.
// Tests that need a missing input skip themselves.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "test_util.h"  // TempDir and the other shared helpers
#include "tokenizer/tokenizer.h"

namespace qtrain::test {

inline std::string qwen_tokenizer_json() {
    return std::string(QTRAIN_SHARED_DATA_DIR) + "/qwen2.5-tokenizer/tokenizer.json";
}

inline std::string reference_dir() {
    if (const char* dir = std::getenv("QTRAIN_TOKENIZER_REFERENCE_DIR")) return dir;
    return (std::filesystem::current_path() / "tokenizer-reference").string();
}

// The Qwen2.5 tokenizer, loaded once per test binary (loading parses 7 MB of JSON).
inline const Tokenizer* qwen_tokenizer() {
    static const Tokenizer* tok = [] () -> const Tokenizer* {
        if (!std::filesystem::exists(qwen_tokenizer_json())) return nullptr;
        return new Tokenizer(Tokenizer::from_hf_json(qwen_tokenizer_json()));
    }();
    return tok;
}

#define QTRAIN_REQUIRE_QWEN_TOKENIZER(var)                                                      \
    const ::qtrain::Tokenizer* var = ::qtrain::test::qwen_tokenizer();                          \
    if (!var) GTEST_SKIP() << "no " << ::qtrain::test::qwen_tokenizer_json() << " (../shared data)"

// Writes a small byte-level BPE tokenizer.json with the Qwen2 pipeline: the 256 byte tokens, then
// the merges given as (left, right) spellings, in either of the two tokenizer.json merge forms, and
// two added tokens: <|endoftext|> (special) and <tool_call> (not special).
std::string write_tiny_tokenizer_json(const std::string& dir,
                                      const std::vector<std::pair<std::string, std::string>>& merges,
                                      bool pair_form);

}  // namespace qtrain::test
