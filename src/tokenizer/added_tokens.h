// Added tokens (tokenizer.json "added_tokens": <|endoftext|>, <|im_start|>, <tool_call>, ...) and
// how raw text is searched for them. As in HF `tokenizers`, a match is leftmost-longest and found
// before normalization (for tokens with "normalized": false); the text between matches is encoded
// by the normal path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qtrain {

// Which added tokens encoding recognises in raw text.
enum class SpecialTokens {
    // Default, for training data: tokens marked "special" are plain text (their characters are
    // BPE-encoded together with the text around them); non-special added tokens such as Qwen's
    // <tool_call> are still recognised. This is exactly HF's `encode_special_tokens = True`, i.e.
    // transformers' split_special_tokens=True, which is what llm.q's data preparation uses. Like
    // HF, the search still matches special tokens (a special token's text hides a non-special
    // token that overlaps it) and then leaves them as text.
    kAsText,
    // Every added token is recognised (HF's default encode()).
    kRecognize,
    // No added token is recognised; everything is BPE-encoded (tiktoken's encode_ordinary).
    kNone,
};

struct AddedToken {
    std::string content;
    int32_t id = 0;
    bool special = false;
    bool normalized = false;  // matched in the normalized text rather than the raw text
};

class AddedTokenMatcher {
public:
    AddedTokenMatcher() = default;
    // Keeps the tokens with the given `normalized` flag.
    AddedTokenMatcher(const std::vector<AddedToken>& tokens, bool normalized);

    struct Match {
        std::size_t pos, len;
        int32_t id;
        bool special;
    };
    // The leftmost-longest match of any added token in text[from..).
    std::optional<Match> find(std::string_view text, std::size_t from) const;
    bool empty() const { return tokens_.empty(); }

private:
    std::vector<AddedToken> tokens_;  // sorted by length, longest first
    uint8_t first_byte_[256] = {};    // 1: some token starts with this byte
    int only_first_byte_ = -1;        // the first byte when all tokens share it (memchr scan)
};

// Splits `text` at the added tokens that `mode` recognises: calls text_fn(segment) for the text
// between them and token_fn(id, match) for each token (segments and matches are views of `text`, so
// their position in it is known).
template <class TextFn, class TokenFn>
void split_added(const AddedTokenMatcher& matcher, std::string_view text, SpecialTokens mode,
                 TextFn&& text_fn, TokenFn&& token_fn) {
    if (mode == SpecialTokens::kNone || matcher.empty()) {
        text_fn(text);
        return;
    }
    std::size_t segment_start = 0, search = 0;
    while (const auto m = matcher.find(text, search)) {
        search = m->pos + m->len;
        if (mode == SpecialTokens::kAsText && m->special) continue;  // stays text
        text_fn(text.substr(segment_start, m->pos - segment_start));
        token_fn(m->id, text.substr(m->pos, m->len));
        segment_start = search;
    }
    text_fn(text.substr(segment_start));
}

}  // namespace qtrain
