// Where a run's model comes from: its shape (config.json of the --model directory, or a built-in
// preset) and, for a directory, its weights and tokenizer files.
#pragma once

#include <optional>
#include <string>

#include "model/model_config.h"

namespace qtrain {

struct TrainOptions;

struct ModelSource {
    ModelConfig config;
    std::string description;              // "preset Qwen2.5-0.5B" or the directory
    std::optional<std::string> directory; // HF directory (config.json, maybe weights, tokenizer)
};

// Reads config.json from the --model directory, or takes a built-in preset (needs --from-scratch).
ModelSource resolve_model_source(const TrainOptions& options);

}  // namespace qtrain
