// The reference corpus (scripts/tokenizer_make_reference.py writes reference.bin: varied documents
// and the ids HF `tokenizers` gives them in the three special-token modes), read once per test
// binary. Tests that need it skip when it is absent.
#pragma once

#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tokenizer_test_data.h"

namespace qtrain {

struct RefDoc {
    std::string raw, normalized;
    std::vector<int32_t> ids[3];  // kAsText, kRecognize, kNone
};
inline constexpr SpecialTokens kModes[3] = {SpecialTokens::kAsText, SpecialTokens::kRecognize,
                                            SpecialTokens::kNone};
inline constexpr const char* kModeNames[3] = {"kAsText", "kRecognize", "kNone"};

// The reference of the tokenizer in `dir` (Qwen2.5's: reference_dir(); Llama 3's: its llama3.2/ and
// llama3/ below it), read once; nullptr when absent.
inline const std::vector<RefDoc>* reference(const std::string& dir = test::reference_dir()) {
    static std::mutex mutex;
    static std::map<std::string, const std::vector<RefDoc>*> loaded;
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = loaded.find(dir); it != loaded.end()) return it->second;
    const std::vector<RefDoc>*& docs = loaded[dir];
    docs = [&]() -> const std::vector<RefDoc>* {
        const std::string path = dir + "/reference.bin";
        std::ifstream in(path, std::ios::binary);
        if (!in) return nullptr;
        auto u32 = [&] {
            uint32_t v = 0;
            in.read(reinterpret_cast<char*>(&v), 4);
            return v;
        };
        char magic[8];
        in.read(magic, 8);
        if (std::string(magic, 8) != "QTOKREF1") return nullptr;
        auto* out = new std::vector<RefDoc>(u32());
        for (RefDoc& d : *out) {
            for (std::string* s : {&d.raw, &d.normalized}) {
                s->resize(u32());
                in.read(s->data(), static_cast<std::streamsize>(s->size()));
            }
            for (auto& ids : d.ids) {
                ids.resize(u32());
                in.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
            }
        }
        if (!in) {
            delete out;
            return nullptr;
        }
        return out;
    }();
    return docs;
}

#define QTRAIN_REQUIRE_REFERENCE(var)                                                          \
    const std::vector<RefDoc>* var = reference();                                              \
    if (!var)                                                                                  \
    GTEST_SKIP() << "no " << test::reference_dir()                                             \
                 << "/reference.bin: run scripts/tokenizer_make_reference.py (see its header)"

}  // namespace qtrain
