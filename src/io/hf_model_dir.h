// Where a model comes from: a local directory, or "org/name" found in the local HF hub cache
// ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub, layout
// models--org--name/snapshots/<revision>/). qtrain never downloads.
#pragma once

#include <optional>
#include <string>

namespace qtrain {

// Returns the directory holding config.json for `model`, or std::nullopt if neither a local
// directory nor a cached snapshot exists.
std::optional<std::string> find_model_dir(const std::string& model);
// As find_model_dir, but throws an error that lists the places it looked.
std::string resolve_model_dir(const std::string& model);
// What a --tokenizer flag names (`tokenize` and `train` take the same): an existing file or
// directory as it is, else the directory of that model in the local HF cache. Throws naming
// `flag` when it is neither. Which file inside a directory is the tokenizer's own business
// (Tokenizer::load).
std::string resolve_tokenizer_path(const std::string& spec, const std::string& flag);

}  // namespace qtrain
