// Loss masks of rendered chats: which tokens are trained, from the trained bytes of the render.
// A token is trained iff any of its bytes lies in a trained span: transformers' rule for
// return_assistant_tokens_mask (a token overlapping a span), with spans at character boundaries
// so that bytes and characters agree.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/chat_process.h"
#include "tokenizer/tokenizer.h"

namespace qtrain {

using ByteSpan = std::pair<std::size_t, std::size_t>;  // [begin, end)

// mask[i] = 1 iff offsets[i] overlaps one of `spans` (sorted, disjoint).
std::vector<uint8_t> mask_from_spans(const std::vector<TokenOffset>& offsets, const std::vector<ByteSpan>& spans);

// One conversation, tokenized: its ids (exactly apply_chat_template(..., tokenize=True)) and mask.
struct ChatTokens {
    std::vector<int32_t> tokens;
    std::vector<uint8_t> mask;
    bool truncated = false;  // cut at max_tokens
    int64_t trained() const;
};

// Tokenizes a render (all added tokens recognised, as transformers' tokenizer(text,
// add_special_tokens=False) does) and cuts it to `max_tokens` (<= 0: no limit).
ChatTokens tokenize_chat(const Tokenizer& tokenizer, const RenderedChat& chat, int64_t max_tokens);

// The strings that end an assistant turn (rule b): the eos_token plus those of <|im_end|>, <|eot_id|>
// and <|eom_id|> that are added tokens of `tokenizer`.
std::vector<std::string> default_end_of_turn(const Tokenizer& tokenizer, const std::string& eos_token);

}  // namespace qtrain
