// The files of a HF model directory besides the weights and config.json that the final export
// carries over into --out-dir, so that it is a whole HF model: generation_config.json always, the
// tokenizer's files unless --tokenizer gave them (output_tokenizer.h).
#pragma once

#include <string>

namespace qtrain {

void copy_model_dir_files(const std::string& from_dir, const std::string& to_dir, bool tokenizer_files);

}  // namespace qtrain
