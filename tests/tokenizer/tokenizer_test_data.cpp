#include "tokenizer_test_data.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace qtrain::test {

namespace {

// The 256 byte tokens then one token per merge, and the merges, in the byte-level spelling.
struct TinyBpe {
    nlohmann::json vocab = nlohmann::json::object();
    nlohmann::json merges = nlohmann::json::array();
    int next_id = 256;
};

TinyBpe tiny_bpe(const std::vector<std::pair<std::string, std::string>>& merges, bool pair_form) {
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
    TinyBpe out;
    for (int b = 0; b < 256; ++b) out.vocab[spelled[b]] = b;
    for (const auto& [left, right] : merges) {
        const std::string merged = spell(left + right);
        if (!out.vocab.contains(merged)) out.vocab[merged] = out.next_id++;
        if (pair_form) {
            out.merges.push_back(json::array({spell(left), spell(right)}));
        } else {
            out.merges.push_back(spell(left) + " " + spell(right));
        }
    }
    return out;
}

nlohmann::json added_token(int id, const std::string& content, bool special) {
    return {{"id", id},          {"content", content}, {"special", special}, {"normalized", false},
            {"lstrip", false},   {"rstrip", false},    {"single_word", false}};
}

nlohmann::json split_then_byte_level(const char* regex) {
    using nlohmann::json;
    return {{"type", "Sequence"},
            {"pretokenizers",
             json::array({{{"type", "Split"},
                           {"pattern", {{"Regex", regex}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", false}}})}};
}

nlohmann::json bpe_model(TinyBpe& bpe, bool ignore_merges) {
    return {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", ignore_merges},
            {"vocab", bpe.vocab},
            {"merges", bpe.merges}};
}

std::string write_json(const std::string& dir, const nlohmann::json& j) {
    const std::string path = dir + "/tokenizer.json";
    std::ofstream(path) << j.dump(1);
    return path;
}

}  // namespace

std::string write_tiny_tokenizer_json(const std::string& dir,
                                      const std::vector<std::pair<std::string, std::string>>& merges,
                                      bool pair_form) {
    using nlohmann::json;
    TinyBpe bpe = tiny_bpe(merges, pair_form);
    const int id = bpe.next_id;
    json j = {
        {"version", "1.0"},
        {"added_tokens", json::array({added_token(id, "<|endoftext|>", true), added_token(id + 1, "<tool_call>", false)})},
        {"normalizer", {{"type", "NFC"}}},
        {"pre_tokenizer", split_then_byte_level(kQwen2Split.regex)},
        {"model", bpe_model(bpe, false)},
    };
    // As it always was: empty prefix and suffix, ByteLevel without trim_offsets, no ignore_merges.
    j["model"]["continuing_subword_prefix"] = "";
    j["model"]["end_of_word_suffix"] = "";
    j["model"].erase("ignore_merges");
    j["pre_tokenizer"]["pretokenizers"][1]["trim_offsets"] = false;
    return write_json(dir, j);
}

std::string write_tiny_llama3_tokenizer_json(const std::string& dir,
                                             const std::vector<std::pair<std::string, std::string>>& merges) {
    using nlohmann::json;
    TinyBpe bpe = tiny_bpe(merges, false);
    const int base = bpe.next_id;
    const char* names[] = {"<|begin_of_text|>",           "<|end_of_text|>",
                           "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                           "<|reserved_special_token_2|>", "<|reserved_special_token_3|>",
                           "<|start_header_id|>",          "<|end_header_id|>",
                           "<|reserved_special_token_4|>", "<|eot_id|>"};
    json added = json::array();
    for (int i = 0; i < 10; ++i) added.push_back(added_token(base + i, names[i], true));
    auto piece = [](const char* kind, const char* id, int type_id) {
        return json{{kind, {{"id", id}, {"type_id", type_id}}}};
    };
    const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
    json j = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added},
        {"normalizer", nullptr},
        {"pre_tokenizer", split_then_byte_level(kLlama3Split.regex)},
        {"post_processor",
         {{"type", "Sequence"},
          {"processors",
           json::array({byte_level,
                        {{"type", "TemplateProcessing"},
                         {"single", json::array({piece("SpecialToken", "<|begin_of_text|>", 0), piece("Sequence", "A", 0)})},
                         {"pair", json::array({piece("SpecialToken", "<|begin_of_text|>", 0), piece("Sequence", "A", 0),
                                               piece("SpecialToken", "<|begin_of_text|>", 1), piece("Sequence", "B", 1)})},
                         {"special_tokens",
                          {{"<|begin_of_text|>",
                            {{"id", "<|begin_of_text|>"},
                             {"ids", json::array({base})},
                             {"tokens", json::array({"<|begin_of_text|>"})}}}}}}})}}},
        {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
        {"model", bpe_model(bpe, true)},
    };
    return write_json(dir, j);
}

}  // namespace qtrain::test
