#include "tokenizer/chat_mask.h"

#include <algorithm>

namespace qtrain {

std::vector<uint8_t> mask_from_spans(const std::vector<TokenOffset>& offsets, const std::vector<ByteSpan>& spans) {
    std::vector<uint8_t> mask(offsets.size(), 0);
    std::size_t s = 0;
    for (std::size_t i = 0; i < offsets.size(); ++i) {
        // tokens and spans both run forward: skip the spans that end before this token
        while (s < spans.size() && spans[s].second <= offsets[i].begin) ++s;
        if (s == spans.size()) break;
        if (offsets[i].end > spans[s].first) mask[i] = 1;
    }
    return mask;
}

int64_t ChatTokens::trained() const { return std::count(mask.begin(), mask.end(), uint8_t{1}); }

ChatTokens tokenize_chat(const Tokenizer& tokenizer, const RenderedChat& chat, int64_t max_tokens) {
    ChatTokens out;
    std::vector<TokenOffset> offsets;
    tokenizer.encode_with_offsets(chat.text, out.tokens, offsets, SpecialTokens::kRecognize);
    out.mask = mask_from_spans(offsets, chat.spans);
    if (max_tokens > 0 && static_cast<int64_t>(out.tokens.size()) > max_tokens) {
        out.tokens.resize(static_cast<std::size_t>(max_tokens));
        out.mask.resize(static_cast<std::size_t>(max_tokens));
        out.truncated = true;
    }
    return out;
}

std::vector<std::string> default_end_of_turn(const Tokenizer& tokenizer, const std::string& eos_token) {
    std::vector<std::string> out;
    if (!eos_token.empty()) out.push_back(eos_token);
    for (const char* t : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>"}) {
        const bool added = std::any_of(tokenizer.added_tokens().begin(), tokenizer.added_tokens().end(),
                                       [&](const AddedToken& a) { return a.content == t; });
        if (added && std::find(out.begin(), out.end(), t) == out.end()) out.emplace_back(t);
    }
    return out;
}

}  // namespace qtrain
