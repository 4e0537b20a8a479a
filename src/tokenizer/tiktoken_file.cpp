// Reads a tiktoken rank file ("<base64 of the token's bytes> <rank>" per line, rank = id), e.g.
// qwen.tiktoken from the qwen-agent wheel. tiktoken merges the adjacent pair whose concatenation
// has the lowest rank, so every split of a token into two tokens becomes a merge with the rank of
// the whole token. The file holds no added tokens; Qwen's 22 (the same ids and flags as Qwen2.5's
// tokenizer.json) are appended after the ranks, since Qwen's is the vocabulary qtrain targets.
#include <unordered_map>

#include "core/error.h"
#include "core/files.h"
#include "tokenizer/tokenizer.h"

namespace qtrain {
namespace {

// Decodes standard base64 (with '=' padding); false on any other character.
bool decode_base64(std::string_view in, std::string& out) {
    auto value = [](char c) -> int {
        if (c >= 'A' && c <= 'Z') return c - 'A';
        if (c >= 'a' && c <= 'z') return c - 'a' + 26;
        if (c >= '0' && c <= '9') return c - '0' + 52;
        if (c == '+') return 62;
        if (c == '/') return 63;
        return -1;
    };
    out.clear();
    uint32_t acc = 0;
    int bits = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
        if (in[i] == '=') {
            for (std::size_t k = i; k < in.size(); ++k) {
                if (in[k] != '=') return false;
            }
            break;
        }
        const int v = value(in[i]);
        if (v < 0) return false;
        acc = (acc << 6) | static_cast<uint32_t>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(static_cast<char>((acc >> bits) & 0xFF));
        }
    }
    return true;
}

struct QwenAddedToken {
    const char* content;
    bool special;
};
// Qwen2.5's added tokens in id order (tokenizer.json ids 151643..151664).
constexpr QwenAddedToken kQwenAddedTokens[] = {
    {"<|endoftext|>", true},        {"<|im_start|>", true},       {"<|im_end|>", true},
    {"<|object_ref_start|>", true}, {"<|object_ref_end|>", true}, {"<|box_start|>", true},
    {"<|box_end|>", true},          {"<|quad_start|>", true},     {"<|quad_end|>", true},
    {"<|vision_start|>", true},     {"<|vision_end|>", true},     {"<|vision_pad|>", true},
    {"<|image_pad|>", true},        {"<|video_pad|>", true},      {"<tool_call>", false},
    {"</tool_call>", false},        {"<|fim_prefix|>", false},    {"<|fim_middle|>", false},
    {"<|fim_suffix|>", false},      {"<|fim_pad|>", false},       {"<|repo_name|>", false},
    {"<|file_sep|>", false},
};

}  // namespace

Tokenizer Tokenizer::from_tiktoken(const std::string& path) {
    const std::string text = read_text_file(path);
    TokenizerSpec spec;
    spec.source = path;
    spec.format = TokenizerFormat::kTiktoken;
    spec.nfc = true;  // Qwen's tiktoken tokenizer normalizes to NFC before splitting, like HF's
    std::vector<char> seen;
    std::size_t line_no = 0;
    for (std::size_t pos = 0; pos < text.size();) {
        std::size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        std::string_view line(text.data() + pos, end - pos);
        pos = end + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty()) continue;
        const std::size_t space = line.find(' ');
        std::string bytes;
        long rank = -1;
        if (space != std::string_view::npos && decode_base64(line.substr(0, space), bytes)) {
            try {
                std::size_t used = 0;
                const std::string number(line.substr(space + 1));
                rank = std::stol(number, &used);
                if (used != number.size()) rank = -1;
            } catch (const std::exception&) {
                rank = -1;
            }
        }
        QT_CHECK(rank >= 0 && !bytes.empty(), path, ":", line_no,
                 ": not a tiktoken rank line (expected '<base64 bytes> <rank>'): '",
                 std::string(line.substr(0, 80)), "'");
        if (static_cast<std::size_t>(rank) >= spec.tokens.size()) {
            spec.tokens.resize(rank + 1);
            seen.resize(rank + 1, 0);
        }
        QT_CHECK(!seen[rank], path, ":", line_no, ": rank ", rank, " appears twice");
        seen[rank] = 1;
        spec.tokens[rank] = std::move(bytes);
    }
    QT_CHECK(!spec.tokens.empty(), path, ": empty tiktoken file");
    for (std::size_t id = 0; id < seen.size(); ++id) {
        QT_CHECK(seen[id], path, ": ranks must be 0..", seen.size() - 1, " without gaps (", id,
                 " is missing)");
    }

    std::unordered_map<std::string_view, int32_t> ids;
    ids.reserve(spec.tokens.size());
    for (std::size_t id = 0; id < spec.tokens.size(); ++id) {
        ids.emplace(spec.tokens[id], static_cast<int32_t>(id));
    }
    for (std::size_t id = 0; id < spec.tokens.size(); ++id) {
        const std::string_view t = spec.tokens[id];
        for (std::size_t k = 1; k < t.size(); ++k) {
            const auto left = ids.find(t.substr(0, k));
            if (left == ids.end()) continue;
            const auto right = ids.find(t.substr(k));
            if (right == ids.end()) continue;
            const auto rank = static_cast<int32_t>(id);
            spec.merges.push_back({left->second, right->second, rank, rank});
        }
    }

    int32_t next_id = static_cast<int32_t>(spec.tokens.size());
    for (const QwenAddedToken& t : kQwenAddedTokens) {
        spec.added.push_back(AddedToken{t.content, next_id++, t.special, false});
    }
    return Tokenizer(std::move(spec));
}

}  // namespace qtrain
