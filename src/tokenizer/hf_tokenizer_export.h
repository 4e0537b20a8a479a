// Puts the HF tokenizer files of a loaded Tokenizer into a model directory (the trainer's
// output/), so that transformers' AutoTokenizer, `tokenizers` and lm_eval load the model's
// tokenizer from there:
//  - from a tokenizer.json: that file as it is, with the tokenizer_config.json, special_tokens_map.json,
//    added_tokens.json, vocab.json, merges.txt and chat_template.jinja beside it when it is named
//    tokenizer.json (a model directory); a tokenizer_config.json is written when there is none;
//  - from a tiktoken rank file: tokenizer.json and tokenizer_config.json built from the ranks
//    (hf_tokenizer_writer.h).
// Any other of those seven files already in the directory is removed: a stale vocab.json or
// special_tokens_map.json of an earlier run would be loaded together with the new files.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace qtrain {

// Returns the names of the files now in `dir`, in the order written. Errors name the files.
std::vector<std::string> export_hf_tokenizer(const Tokenizer& tok, const std::string& dir);

}  // namespace qtrain
