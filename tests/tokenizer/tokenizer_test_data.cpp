#include "tokenizer_test_data.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace qtrain::test {

std::string write_tiny_tokenizer_json(const std::string& dir,
                                      const std::vector<std::pair<std::string, std::string>>& merges,
                                      bool pair_form) {
    using nlohmann::json;
    // GPT-2's byte-level spelling of each byte.
    std::string spelled[256];
    int next = 256;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        spelled[b].clear();
        utf8::append(spelled[b], static_cast<char32_t>(printable ? b : next++));
    }
    auto spell = [&](const std::string& bytes) {
        std::string s;
        for (unsigned char c : bytes) s += spelled[c];
        return s;
    };
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[spelled[b]] = b;
    json merge_list = json::array();
    int id = 256;
    for (const auto& [left, right] : merges) {
        const std::string merged = spell(left + right);
        if (!vocab.contains(merged)) vocab[merged] = id++;
        if (pair_form) {
            merge_list.push_back(json::array({spell(left), spell(right)}));
        } else {
            merge_list.push_back(spell(left) + " " + spell(right));
        }
    }
    json j = {
        {"version", "1.0"},
        {"added_tokens",
         json::array({{{"id", id}, {"content", "<|endoftext|>"}, {"special", true},
                       {"normalized", false}, {"lstrip", false}, {"rstrip", false},
                       {"single_word", false}},
                      {{"id", id + 1}, {"content", "<tool_call>"}, {"special", false},
                       {"normalized", false}, {"lstrip", false}, {"rstrip", false},
                       {"single_word", false}}})},
        {"normalizer", {{"type", "NFC"}}},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           json::array({{{"type", "Split"},
                         {"pattern", {{"Regex", kQwen2SplitPattern}}},
                         {"behavior", "Isolated"},
                         {"invert", false}},
                        {{"type", "ByteLevel"},
                         {"add_prefix_space", false},
                         {"trim_offsets", false},
                         {"use_regex", false}}})}}},
        {"model",
         {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", ""},
          {"end_of_word_suffix", ""},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"vocab", vocab},
          {"merges", merge_list}}},
    };
    const std::string path = dir + "/tokenizer.json";
    std::ofstream(path) << j.dump(1);
    return path;
}

}  // namespace qtrain::test
