// The tokenizer of `train --tokenizer`: loaded at start-up, so that a wrong path or a tokenizer
// that does not fit the model fails before any training, and written into --out-dir next to the
// model at the end (tokenizer/hf_tokenizer_export.h), so that output/ is a complete HF model.
#pragma once

#include <optional>
#include <string>

#include "tokenizer/tokenizer.h"

namespace qtrain {

// std::nullopt when `spec` is empty. Errors name --tokenizer. Every id the tokenizer can emit must
// be below the model's vocab_size, or the exported model could not embed its own tokenizer's ids.
std::optional<Tokenizer> load_output_tokenizer(const std::string& spec, int model_vocab_size);

}  // namespace qtrain
