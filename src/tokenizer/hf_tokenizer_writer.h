// The text of the two HF tokenizer files that describe a qtrain Tokenizer:
//  - tokenizer.json (what `tokenizers` and transformers' fast tokenizers load): byte-level BPE with
//    the vocabulary in the byte-level alphabet, merges derived from the ranks (tiktoken_merges.h),
//    the tokenizer's split regex + ByteLevel, NFC when the tokenizer normalizes, the added tokens with
//    qtrain's ids, the BOS template when it has one — the structure of Qwen2.5's own tokenizer.json,
//    key for key (and of Llama 3's post-processor);
//  - tokenizer_config.json (what AutoTokenizer reads first): Qwen2Tokenizer with the eos/pad tokens
//    of the Qwen2.5 base models (<|endoftext|>), the added tokens and the other special tokens; for a
//    tokenizer that adds a BOS (Llama 3), PreTrainedTokenizerFast with the bos and eos
//    (<|begin_of_text|>, <|end_of_text|>) of Llama 3's base models.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace qtrain {

// For a tokenizer whose merges follow its ranks (one loaded from a tiktoken file). Throws for one
// loaded from a tokenizer.json (copy that file instead: its merges need not follow the ids) or
// built in memory.
std::string hf_tokenizer_json_from_ranks(const Tokenizer& tok);

// For any tokenizer; only its added tokens matter.
std::string hf_tokenizer_config_json(const Tokenizer& tok);

}  // namespace qtrain
