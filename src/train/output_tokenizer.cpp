#include "train/output_tokenizer.h"

#include "core/error.h"
#include "io/hf_model_dir.h"

namespace qtrain {

std::optional<Tokenizer> load_output_tokenizer(const std::string& spec, int model_vocab_size) {
    if (spec.empty()) return std::nullopt;
    const std::string path = resolve_tokenizer_path(spec, "--tokenizer");
    std::optional<Tokenizer> tok;
    try {
        tok.emplace(Tokenizer::load(path));
    } catch (const Error& e) {
        throw_error(cat("--tokenizer: ", e.what()));
    }
    QT_CHECK(tok->vocab_size() <= model_vocab_size, "--tokenizer: ", tok->source(), " has ids up to ",
             tok->vocab_size() - 1, " but the model's vocab_size is ", model_vocab_size,
             " (a tokenizer of another model?)");
    return tok;
}

}  // namespace qtrain
