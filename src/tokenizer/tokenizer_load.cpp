// Finds the tokenizer file behind a path: a tokenizer.json, a *.tiktoken file, or a model
// directory holding either.
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace qtrain {
namespace {

namespace fs = std::filesystem;

// A tiktoken file starts with "<base64> <digits>"; a tokenizer.json with '{'.
bool looks_like_tiktoken(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::string first;
    std::getline(in, first);
    const std::size_t space = first.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 >= first.size()) return false;
    for (std::size_t i = space + 1; i < first.size(); ++i) {
        if ((first[i] < '0' || first[i] > '9') && first[i] != '\r') return false;
    }
    return first[0] != '{';
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
    std::error_code ec;
    QT_CHECK(fs::exists(path, ec), "tokenizer: '", path, "' does not exist");
    if (fs::is_directory(path, ec)) {
        for (const char* name : {"tokenizer.json", "qwen.tiktoken"}) {
            const fs::path candidate = fs::path(path) / name;
            if (fs::is_regular_file(candidate, ec)) return load(candidate.string());
        }
        throw_error(cat("tokenizer: directory '", path,
                        "' holds neither tokenizer.json nor qwen.tiktoken"));
    }
    if (path.ends_with(".tiktoken") || looks_like_tiktoken(path)) return from_tiktoken(path);
    return from_hf_json(path);
}

}  // namespace qtrain
