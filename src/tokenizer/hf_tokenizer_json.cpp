// Reads a HF tokenizer.json. qtrain implements one pipeline (optional NFC, the Qwen2 or Llama 3 split
// regex, byte-level BPE, optionally one token put before each sequence by the post-processor), so
// anything else in the file is rejected with a message that says what was found, instead of
// silently giving different ids.

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "tokenizer/byte_alphabet.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace qtrain {
namespace {

using nlohmann::json;

std::string to_bytes(const std::string& spelled, const std::string& path) {
    const ByteAlphabet& alphabet = ByteAlphabet::get();
    std::string bytes;
    for (std::size_t i = 0; i < spelled.size();) {
        int len;
        const char32_t cp = utf8::decode(spelled.data() + i, len);
        i += static_cast<std::size_t>(len);
        QT_CHECK(cp < 512 && alphabet.byte_of[cp] >= 0, path, ": vocabulary entry '", spelled,
                 "' is not in the byte-level alphabet (only byte-level BPE is supported)");
        bytes.push_back(static_cast<char>(alphabet.byte_of[cp]));
    }
    return bytes;
}

std::string describe(const json& j) {
    std::string s = j.dump();
    return s.size() > 300 ? s.substr(0, 300) + "..." : s;
}

bool read_normalizer(const json& n, const std::string& path) {
    if (n.is_null()) return false;
    const std::string type = n.value("type", "");
    if (type == "NFC") return true;
    if (type == "Sequence") {
        bool nfc = false;
        for (const json& part : n.at("normalizers")) nfc = read_normalizer(part, path) || nfc;
        return nfc;
    }
    throw_error(cat(path, ": unsupported normalizer ", describe(n),
                    " (qtrain's tokenizer implements NFC or none)"));
}

// The split pattern of the pre-tokenizer: Sequence[Split(Regex, Isolated), ByteLevel without its own
// regex], the regex one of those pretokenizer.h implements.
const SplitPattern& read_pre_tokenizer(const json& p, const std::string& path) {
    const auto fail = [&] {
        throw_error(cat(path, ": unsupported pre_tokenizer ", describe(p),
                        " (qtrain's tokenizer implements the Qwen2 or Llama 3 split regex followed by "
                        "ByteLevel without its own regex)"));
    };
    if (p.value("type", "") != "Sequence") fail();
    const json& parts = p.at("pretokenizers");
    if (parts.size() != 2) fail();
    const json& split = parts[0];
    const json& byte_level = parts[1];
    if (split.value("type", "") != "Split" || !split.contains("pattern") || !split["pattern"].is_object() ||
        !split["pattern"].contains("Regex") || split.value("behavior", "") != "Isolated" ||
        split.value("invert", false)) {
        fail();
    }
    if (byte_level.value("type", "") != "ByteLevel" || byte_level.value("add_prefix_space", false) ||
        byte_level.value("use_regex", true)) {
        fail();
    }
    const std::string regex = split["pattern"]["Regex"].get<std::string>();
    const SplitPattern* pattern = find_split_pattern(regex);
    if (!pattern) {
        throw_error(cat(path, ": unsupported split regex ", json(regex).dump(),
                        " in pre_tokenizer (qtrain implements exactly two, not a regex engine: ",
                        kQwen2Split.name, "'s ", json(kQwen2Split.regex).dump(), " and ", kLlama3Split.name,
                        "'s ", json(kLlama3Split.regex).dump(), ")"));
    }
    return *pattern;
}

// The token the post-processor puts before each sequence, if any. Accepted: none, ByteLevel (it only
// adjusts offsets), TemplateProcessing whose "single" template is $A alone or one special token then
// $A, and a Sequence of these. Anything else would add tokens qtrain does not add.
std::optional<int32_t> read_post_processor(const json& p, const std::string& path) {
    if (p.is_null()) return std::nullopt;
    const auto fail = [&](const std::string& why) {
        throw_error(cat(path, ": unsupported post_processor ", describe(p), " (", why,
                        "; qtrain implements ByteLevel and a TemplateProcessing that puts at most one "
                        "special token before $A, such as Llama 3's <|begin_of_text|> $A)"));
    };
    const std::string type = p.value("type", "");
    if (type == "ByteLevel") return std::nullopt;
    if (type == "Sequence") {
        std::optional<int32_t> bos;
        for (const json& part : p.at("processors")) {
            if (const auto b = read_post_processor(part, path)) {
                if (bos) fail("two processors add tokens");
                bos = b;
            }
        }
        return bos;
    }
    if (type != "TemplateProcessing") fail(cat("type '", type, "'"));
    const json& single = p.at("single");
    std::optional<int32_t> bos;
    bool sequence = false;
    for (const json& piece : single) {
        if (piece.contains("Sequence")) {
            if (piece["Sequence"].value("id", "") != "A" || sequence) fail("the single template is not [token] $A");
            sequence = true;
        } else if (piece.contains("SpecialToken")) {
            if (sequence) fail("a token after $A");
            if (bos) fail("more than one token before $A");
            const std::string name = piece["SpecialToken"].at("id").get<std::string>();
            const json& special = p.value("special_tokens", json::object());
            if (!special.contains(name) || special[name].at("ids").size() != 1) {
                fail(cat("special token '", name, "' is not in special_tokens with exactly one id"));
            }
            bos = special[name]["ids"][0].get<int32_t>();
        } else {
            fail("an unknown template piece");
        }
    }
    if (!sequence) fail("the single template has no $A");
    return bos;
}

void check_model(const json& m, const std::string& path) {
    if (m.value("type", "BPE") != "BPE") {
        throw_error(cat(path, ": model type '", m.value("type", ""), "' is not BPE"));
    }
    auto is_empty = [&](const char* key) {
        return !m.contains(key) || m[key].is_null() || (m[key].is_string() && m[key].get<std::string>().empty());
    };
    QT_CHECK(!m.value("byte_fallback", false), path, ": byte_fallback BPE is not supported");
    QT_CHECK(is_empty("continuing_subword_prefix") && is_empty("end_of_word_suffix"), path,
             ": BPE with continuing_subword_prefix/end_of_word_suffix is not supported");
    QT_CHECK(!m.contains("dropout") || m["dropout"].is_null() ||
                 m["dropout"].get<double>() == 0.0,
             path, ": BPE dropout is not supported");
}

}  // namespace

Tokenizer Tokenizer::from_hf_json(const std::string& path) {
    json j;
    try {
        j = json::parse(read_text_file(path));
    } catch (const json::exception& e) {
        throw_error(cat(path, ": not a valid tokenizer.json (", e.what(), ")"));
    }
    QT_CHECK(j.is_object() && j.contains("model") && j["model"].contains("vocab"), path,
             ": not a HF tokenizer.json (no model.vocab)");
    TokenizerSpec spec;
    spec.source = path;
    spec.format = TokenizerFormat::kHfJson;
    try {
        const json& model = j["model"];
        check_model(model, path);
        spec.nfc = read_normalizer(j.value("normalizer", json()), path);
        spec.split = &read_pre_tokenizer(j.value("pre_tokenizer", json()), path);
        spec.bos_id = read_post_processor(j.value("post_processor", json()), path);
        spec.ignore_merges = model.value("ignore_merges", false);

        const json& vocab = model.at("vocab");
        spec.tokens.resize(vocab.size());
        std::vector<char> seen(vocab.size(), 0);
        for (auto it = vocab.begin(); it != vocab.end(); ++it) {
            const int64_t id = it.value().get<int64_t>();
            QT_CHECK(id >= 0 && id < static_cast<int64_t>(vocab.size()) && !seen[id], path,
                     ": model.vocab ids must be 0..", vocab.size() - 1, " without gaps (found ", id,
                     " for '", it.key(), "')");
            seen[id] = 1;
            spec.tokens[id] = to_bytes(it.key(), path);
        }

        // Merges name tokens by their byte-level spelling.
        std::unordered_map<std::string, int32_t> spelled_ids;
        spelled_ids.reserve(vocab.size());
        for (auto it = vocab.begin(); it != vocab.end(); ++it) {
            spelled_ids.emplace(it.key(), it.value().get<int32_t>());
        }
        auto id_of = [&](const std::string& s, const std::string& merge) {
            const auto found = spelled_ids.find(s);
            QT_CHECK(found != spelled_ids.end(), path, ": merge '", merge, "' uses '", s,
                     "', which is not in model.vocab");
            return found->second;
        };
        const json& merges = model.at("merges");
        spec.merges.reserve(merges.size());
        int32_t rank = 0;
        for (const json& m : merges) {
            std::string left, right;
            if (m.is_string()) {  // "a b": byte-level spellings never contain a space
                const std::string s = m.get<std::string>();
                const std::size_t space = s.find(' ');
                QT_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
                         path, ": merge '", s, "' is not two tokens separated by one space");
                left = s.substr(0, space);
                right = s.substr(space + 1);
            } else {
                QT_CHECK(m.is_array() && m.size() == 2, path, ": merge ", describe(m),
                         " is neither \"a b\" nor [\"a\", \"b\"]");
                left = m[0].get<std::string>();
                right = m[1].get<std::string>();
            }
            const std::string merge = left + " " + right;
            spec.merges.push_back(
                {id_of(left, merge), id_of(right, merge), rank++, id_of(left + right, merge)});
        }

        for (const json& t : j.value("added_tokens", json::array())) {
            AddedToken a;
            a.content = t.at("content").get<std::string>();
            a.id = t.at("id").get<int32_t>();
            a.special = t.value("special", false);
            a.normalized = t.value("normalized", !a.special);
            QT_CHECK(!t.value("lstrip", false) && !t.value("rstrip", false) &&
                         !t.value("single_word", false),
                     path, ": added token '", a.content,
                     "' uses lstrip/rstrip/single_word, which qtrain does not implement");
            spec.added.push_back(std::move(a));
        }
    } catch (const json::exception& e) {
        throw_error(cat(path, ": malformed tokenizer.json (", e.what(), ")"));
    }
    return Tokenizer(std::move(spec));
}

}  // namespace qtrain
