#include "tokenizer/hf_tokenizer_export.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "tokenizer/hf_tokenizer_writer.h"

namespace qtrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTokenizerJson = "tokenizer.json";
constexpr const char* kTokenizerConfig = "tokenizer_config.json";
// The tokenizer files of a HF model directory besides tokenizer.json.
// chat_template.jinja: where transformers >= 4.5x saves the chat template (no longer in
// tokenizer_config.json), so a fine-tuned model keeps the template it was trained with.
constexpr const char* kCompanions[] = {kTokenizerConfig, "special_tokens_map.json", "added_tokens.json",
                                       "vocab.json", "merges.txt", "chat_template.jinja"};

// Copies via a temporary file, so an interrupted export never leaves half a tokenizer.json.
void copy_file_atomic(const fs::path& from, const fs::path& to) {
    std::error_code ec;
    if (fs::exists(to, ec) && fs::equivalent(from, to, ec)) return;  // exporting into its own directory
    const std::string bytes = read_text_file(from.string());
    write_text_file_atomic(to.string(), bytes);
}

}  // namespace

std::vector<std::string> export_hf_tokenizer(const Tokenizer& tok, const std::string& dir) {
    std::vector<std::string> written;
    const fs::path out(dir);
    fs::create_directories(out);
    switch (tok.format()) {
        case TokenizerFormat::kHfJson: {
            const fs::path source(tok.source());
            copy_file_atomic(source, out / kTokenizerJson);
            written.push_back(kTokenizerJson);
            // Companions only from a model directory: beside some other *.json they may belong to
            // anything.
            if (source.filename() == kTokenizerJson) {
                for (const char* name : kCompanions) {
                    std::error_code ec;
                    if (!fs::is_regular_file(source.parent_path() / name, ec)) continue;
                    copy_file_atomic(source.parent_path() / name, out / name);
                    written.push_back(name);
                }
            }
            break;
        }
        case TokenizerFormat::kTiktoken:
            write_text_file_atomic((out / kTokenizerJson).string(), hf_tokenizer_json_from_ranks(tok));
            written.push_back(kTokenizerJson);
            break;
        case TokenizerFormat::kNone:
            throw_error("export_hf_tokenizer: the tokenizer was built in memory; only one loaded from a "
                        "tokenizer.json or a tiktoken file can be exported");
    }
    if (std::find(written.begin(), written.end(), kTokenizerConfig) == written.end()) {
        write_text_file_atomic((out / kTokenizerConfig).string(), hf_tokenizer_config_json(tok));
        written.push_back(kTokenizerConfig);
    }
    for (const char* name : kCompanions) {
        if (std::find(written.begin(), written.end(), name) != written.end()) continue;
        std::error_code ec;
        fs::remove(out / name, ec);
    }
    return written;
}

}  // namespace qtrain
