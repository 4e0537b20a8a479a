#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <cstring>

namespace qtrain {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens, bool normalized) {
    for (const AddedToken& t : tokens) {
        if (t.normalized == normalized && !t.content.empty()) tokens_.push_back(t);
    }
    std::stable_sort(tokens_.begin(), tokens_.end(), [](const AddedToken& a, const AddedToken& b) {
        return a.content.size() > b.content.size();
    });
    for (const AddedToken& t : tokens_) first_byte_[static_cast<uint8_t>(t.content[0])] = 1;
    if (std::count(std::begin(first_byte_), std::end(first_byte_), 1) == 1) {
        only_first_byte_ = static_cast<uint8_t>(tokens_[0].content[0]);
    }
}

std::optional<AddedTokenMatcher::Match> AddedTokenMatcher::find(std::string_view text,
                                                                std::size_t from) const {
    if (tokens_.empty()) return std::nullopt;
    for (std::size_t pos = from; pos < text.size(); ++pos) {
        if (only_first_byte_ >= 0) {  // Qwen's tokens all start with '<': jump between them
            const void* hit = std::memchr(text.data() + pos, only_first_byte_, text.size() - pos);
            if (!hit) break;
            pos = static_cast<std::size_t>(static_cast<const char*>(hit) - text.data());
        } else if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
            continue;
        }
        const std::string_view rest = text.substr(pos);
        for (const AddedToken& t : tokens_) {  // longest first
            if (rest.starts_with(t.content)) return Match{pos, t.content.size(), t.id, t.special};
        }
    }
    return std::nullopt;
}

}  // namespace qtrain
