#include "tokenizer/hf_tokenizer_writer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_alphabet.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tiktoken_merges.h"

namespace qtrain {
namespace {

// Keys in the order HF writes them (Qwen2.5's files), so the output reads like theirs.
using ordered_json = nlohmann::ordered_json;

std::vector<AddedToken> added_by_id(const Tokenizer& tok) {
    std::vector<AddedToken> added = tok.added_tokens();
    std::sort(added.begin(), added.end(), [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
    return added;
}

// tokenizers writes the ByteLevel step with these three settings in the pre-tokenizer, the
// post-processor and the decoder alike.
ordered_json byte_level() {
    return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
}

constexpr const char* kEndOfText = "<|endoftext|>";

// ByteLevel, then (when the tokenizer has one) the token before each sequence, as Llama 3's
// tokenizer.json spells it.
ordered_json post_processor(const Tokenizer& tok) {
    if (!tok.bos_id()) return byte_level();
    const int32_t id = *tok.bos_id();
    const std::string name = tok.decode(std::span(&id, 1));
    auto piece = [&](const char* kind, const std::string& what, int type_id) {
        return ordered_json{{kind, {{"id", what}, {"type_id", type_id}}}};
    };
    ordered_json bos = {{name, {{"id", name}, {"ids", ordered_json::array({id})}, {"tokens", ordered_json::array({name})}}}};
    return {{"type", "Sequence"},
            {"processors",
             ordered_json::array(
                 {byte_level(),
                  {{"type", "TemplateProcessing"},
                   {"single", ordered_json::array({piece("SpecialToken", name, 0), piece("Sequence", "A", 0)})},
                   {"pair", ordered_json::array({piece("SpecialToken", name, 0), piece("Sequence", "A", 0),
                                                 piece("SpecialToken", name, 1), piece("Sequence", "B", 1)})},
                   {"special_tokens", std::move(bos)}}})}};
}

}  // namespace

std::string hf_tokenizer_json_from_ranks(const Tokenizer& tok) {
    QT_CHECK(tok.format() == TokenizerFormat::kTiktoken, tok.source().empty() ? "this tokenizer" : tok.source(),
             ": only a tokenizer loaded from a tiktoken rank file has merges that follow its ranks (copy a "
             "tokenizer.json as it is)");
    const ByteAlphabet& alphabet = ByteAlphabet::get();
    const BpeModel& bpe = tok.bpe();

    ordered_json added = ordered_json::array();
    for (const AddedToken& t : added_by_id(tok)) {
        added.push_back({{"id", t.id},
                         {"content", t.content},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", t.normalized},
                         {"special", t.special}});
    }

    // Built as a list of pairs: inserting 151k keys one by one into an ordered_json object would
    // search the keys each time (it is a vector underneath).
    std::vector<std::string> spelled(static_cast<std::size_t>(bpe.size()));
    std::vector<std::pair<const std::string, ordered_json>> vocab_pairs;
    vocab_pairs.reserve(spelled.size());
    for (int32_t id = 0; id < bpe.size(); ++id) {
        spelled[id] = alphabet.spell(bpe.token(id));
        vocab_pairs.emplace_back(spelled[id], id);
    }
    ordered_json vocab = ordered_json::object_t(vocab_pairs.begin(), vocab_pairs.end());
    ordered_json merges = ordered_json::array();
    for (const RankMerge& m : merges_from_ranks(bpe, tok.source())) {
        merges.push_back(spelled[m.left] + " " + spelled[m.right]);  // spellings never hold a space
    }

    ordered_json model = {{"type", "BPE"},
                          {"dropout", nullptr},
                          {"unk_token", nullptr},
                          {"continuing_subword_prefix", ""},
                          {"end_of_word_suffix", ""},
                          {"fuse_unk", false},
                          {"byte_fallback", false}};
    if (tok.ignore_merges()) model["ignore_merges"] = true;
    model["vocab"] = std::move(vocab);
    model["merges"] = std::move(merges);

    ordered_json j = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", std::move(added)},
        {"normalizer", tok.normalizes_nfc() ? ordered_json{{"type", "NFC"}} : ordered_json(nullptr)},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           ordered_json::array({{{"type", "Split"},
                                 {"pattern", {{"Regex", tok.split_pattern().regex}}},
                                 {"behavior", "Isolated"},
                                 {"invert", false}},
                                byte_level()})}}},
        {"post_processor", post_processor(tok)},
        {"decoder", byte_level()},
        {"model", std::move(model)},
    };
    return j.dump(2) + "\n";
}

// One entry of tokenizer_config.json's added_tokens_decoder, as transformers writes it.
static ordered_json added_token_entry(const AddedToken& t) {
    return {{"content", t.content}, {"lstrip", false},        {"normalized", t.normalized},
            {"rstrip", false},      {"single_word", false},   {"special", t.special}};
}

std::string hf_tokenizer_config_json(const Tokenizer& tok) {
    if (tok.bos_id()) {
        // Llama 3's: the fast tokenizer of tokenizer.json as it is (its post-processor adds the BOS),
        // bos and eos as the base models name them.
        const int32_t bos = *tok.bos_id();
        const std::optional<std::string> eos = tok.end_of_text();
        ordered_json decoder = ordered_json::object();
        for (const AddedToken& t : added_by_id(tok)) {
            decoder[std::to_string(t.id)] = added_token_entry(t);
        }
        ordered_json j = {
            {"added_tokens_decoder", std::move(decoder)},
            {"bos_token", tok.decode(std::span(&bos, 1))},
            {"clean_up_tokenization_spaces", true},
            {"eos_token", eos ? ordered_json(*eos) : ordered_json(nullptr)},
            {"model_input_names", ordered_json::array({"input_ids", "attention_mask"})},
            {"model_max_length", 131072},
            {"tokenizer_class", "PreTrainedTokenizerFast"},
        };
        return j.dump(2) + "\n";
    }
    const bool has_eot = tok.token_id(kEndOfText).has_value();
    ordered_json decoder = ordered_json::object();
    ordered_json additional = ordered_json::array();
    for (const AddedToken& t : added_by_id(tok)) {
        decoder[std::to_string(t.id)] = added_token_entry(t);
        if (t.special && t.content != kEndOfText) additional.push_back(t.content);
    }
    // Qwen2.5's base models end documents (and pad) with <|endoftext|>, which is also what
    // `tokenize` appends to every document; the instruct models' eos is <|im_end|>. No chat
    // template: a model trained here from token files is a base model.
    const ordered_json eot = has_eot ? ordered_json(kEndOfText) : ordered_json(nullptr);
    ordered_json j = {
        {"add_bos_token", false},
        {"add_prefix_space", false},
        {"added_tokens_decoder", std::move(decoder)},
        {"additional_special_tokens", std::move(additional)},
        {"bos_token", nullptr},
        {"clean_up_tokenization_spaces", false},
        {"eos_token", eot},
        {"errors", "replace"},
        {"model_max_length", 131072},
        {"pad_token", eot},
        {"split_special_tokens", false},
        {"tokenizer_class", "Qwen2Tokenizer"},
        {"unk_token", nullptr},
    };
    return j.dump(2) + "\n";
}

}  // namespace qtrain
