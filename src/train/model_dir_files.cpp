#include "train/model_dir_files.h"

#include <filesystem>

namespace qtrain {

namespace fs = std::filesystem;

void copy_model_dir_files(const std::string& from_dir, const std::string& to_dir, bool tokenizer_files) {
    for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
                             "merges.txt", "special_tokens_map.json", "chat_template.jinja"}) {
        if (!tokenizer_files && std::string(name) != "generation_config.json") continue;
        fs::path src = fs::path(from_dir) / name;
        std::error_code ec;
        if (fs::exists(src, ec)) fs::copy_file(src, fs::path(to_dir) / name, fs::copy_options::overwrite_existing, ec);
    }
}

}  // namespace qtrain
