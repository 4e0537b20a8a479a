// tokenize: text -> BIN.TOK token files for `train`.
//
//   tokenize --tokenizer=PATH|MODEL --input=FILES/GLOBS --out-dir=DIR [options]
//   tokenize --dataset=tiny-shakespeare [--model=qwen]      -> data/tiny-shakespeare-qwen/
//
// Documents come from text files (one per file, or cut by --doc-separator) or JSON Lines
// (--text-field, or --prompt-field/--response-field for masked fine-tuning data); each gets the
// tokenizer's BOS put before it where its post-processor adds one (Llama 3's <|begin_of_text|>, as
// HF's tokenizer(doc) does; Qwen's adds none) and its end-of-text token appended (<|endoftext|>,
// Llama 3's <|end_of_text|>). Whole documents go to eval.bin (--eval-fraction of the input bytes,
// counted from the start, the first --eval-tokens tokens, or the first --eval-documents documents)
// and the rest to train.bin, or to
// train-000.bin, train-001.bin, ... of about --shard-tokens tokens each. The header's vocab size
// is every id the tokenizer can emit, regular plus added tokens (151,665 for Qwen2.5, HF's
// len(tokenizer)), so it bounds the tokens, <|endoftext|> = 151,643 included. llm.q writes HF's
// tokenizer.vocab_size instead (151,643, regular tokens only), which its own EOS token exceeds;
// the trainer checks tokens against the model's vocab_size (151,936) in either case.
//
// --chat: JSON Lines conversations (`messages`, or `prompt`/`completion`), rendered by the model's chat
// template exactly as transformers' apply_chat_template(..., tokenize=True) renders and tokenizes them
// (the template runs in jinja2, in a python3 child process: tokenizer/chat_process.h), with loss masks
// (mask 1 = trained) on the assistant turns; each conversation is one document (document starts in the
// file). The trained-token rule is in --help and the README.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <regex>
#include <set>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "io/hf_model_dir.h"
#include "io/row_packing.h"
#include "io/token_file.h"
#include "tokenizer/batch_encoder.h"
#include "tokenizer/chat_reader.h"
#include "tokenizer/chat_template_file.h"
#include "tokenizer/document_reader.h"
#include "tokenizer/named_datasets.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using qtrain::cat;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

qtrain::Tokenizer load_tokenizer(const std::string& spec) {
    return qtrain::Tokenizer::load(qtrain::resolve_tokenizer_path(spec, "--tokenizer"));
}

// The tokenizer of --model when --tokenizer is not given: the model's HF repo in the local cache,
// else (for qwen) Qwen's BPE ranks in the download directory, which need no HF access at all.
qtrain::Tokenizer model_tokenizer(const std::string& model, const std::string& download_dir) {
    const std::string repo = model == "qwen" ? "Qwen/Qwen2.5-0.5B" : model;
    if (const auto dir = qtrain::find_model_dir(repo)) return qtrain::Tokenizer::load(*dir);
    const fs::path ranks = fs::path(download_dir) / "qwen.tiktoken";
    std::error_code ec;
    if (model == "qwen" && fs::exists(ranks, ec)) return qtrain::Tokenizer::load(ranks.string());
    qtrain::throw_error(cat("no tokenizer for --model=", model, ": ", repo, " is not in the local HF cache",
                            model == "qwen" ? cat(" and ", ranks.string(), " does not exist (scripts/"
                                                  "tokenizer_fetch_tiktoken.sh ", download_dir, " puts it there)")
                                            : std::string(),
                            "; or pass --tokenizer=PATH"));
}

// Writes train shards and eval.bin; the file being written is a temporary until finish().
class SplitWriter {
public:
    SplitWriter(std::string dir, int vocab_size, bool masks, int64_t shard_tokens, bool document_starts = false)
        : dir_(std::move(dir)), vocab_size_(vocab_size), masks_(masks), doc_starts_(document_starts),
          shard_tokens_(shard_tokens) {}

    void add(const qtrain::EncodedDocument& doc, bool eval) {
        const auto n = static_cast<int64_t>(doc.tokens.size());
        if (eval) {
            if (!eval_) eval_ = std::make_unique<qtrain::TokenFileWriter>(path("eval"), vocab_size_, masks_, doc_starts_);
            QT_CHECK(eval_->num_tokens() + n <= kMaxFileTokens, "eval.bin would exceed ",
                     kMaxFileTokens, " tokens (the format's limit); use a smaller eval split");
            append(*eval_, doc);
            return;
        }
        if (train_ && (train_->num_tokens() >= shard_tokens_ || train_->num_tokens() + n > kMaxFileTokens)) {
            close_train();
        }
        if (!train_) {
            train_ = std::make_unique<qtrain::TokenFileWriter>(path(fmt::format("train-{:03d}", shards_.size())),
                                                               vocab_size_, masks_, doc_starts_);
        }
        QT_CHECK(n <= kMaxFileTokens, "a document of ", n, " tokens exceeds the format's limit");
        append(*train_, doc);
    }

    bool has_train() const { return train_ || !shards_.empty(); }

    // Closes everything; returns (file, tokens) in order. A single train shard becomes train.bin.
    std::vector<std::pair<std::string, int64_t>> finish() {
        close_train();
        std::vector<std::pair<std::string, int64_t>> files;
        if (shards_.size() == 1) {
            fs::rename(shards_[0].first, path("train"));
            shards_[0].first = path("train");
        }
        files = shards_;
        if (eval_) {
            files.emplace_back(path("eval"), eval_->num_tokens());
            eval_->finish();
            eval_.reset();
        }
        remove_stale(files);
        return files;
    }

private:
    static constexpr int64_t kMaxFileTokens = 2147483647;  // the header's int32 token count

    std::string path(const std::string& stem) const { return (fs::path(dir_) / (stem + ".bin")).string(); }

    void append(qtrain::TokenFileWriter& w, const qtrain::EncodedDocument& doc) {
        if (doc_starts_) w.start_document();
        w.append(doc.tokens.data(), doc.tokens.size(), masks_ ? doc.mask.data() : nullptr);
    }

    void close_train() {
        if (!train_) return;
        shards_.emplace_back(path(fmt::format("train-{:03d}", shards_.size())), train_->num_tokens());
        train_->finish();
        train_.reset();
    }

    // Token files of an earlier run in the same directory would silently join a --train-file glob.
    void remove_stale(const std::vector<std::pair<std::string, int64_t>>& written) {
        std::set<std::string> keep;
        for (const auto& f : written) keep.insert(fs::path(f.first).filename().string());
        static const std::regex ours(R"((train(-\d{3,})?|eval)\.bin)");
        for (const auto& entry : fs::directory_iterator(dir_)) {
            const std::string name = entry.path().filename().string();
            if (std::regex_match(name, ours) && !keep.count(name)) {
                fs::remove(entry.path());
                std::cerr << "removed " << entry.path().string() << " (left by an earlier run)\n";
            }
        }
    }

    std::string dir_;
    int vocab_size_;
    bool masks_, doc_starts_;
    int64_t shard_tokens_;
    std::unique_ptr<qtrain::TokenFileWriter> train_, eval_;
    std::vector<std::pair<std::string, int64_t>> shards_;
};

class ProgressBar {
public:
    explicit ProgressBar(bool enabled) : enabled_(enabled), start_(Clock::now()) {}
    void update(uint64_t done, uint64_t total, int64_t tokens) {
        if (!enabled_) return;
        const double secs = std::max(1e-9, seconds_since(start_));
        const double frac = total ? std::min(1.0, static_cast<double>(done) / total) : 1.0;
        const int width = 30, filled = static_cast<int>(frac * width);
        std::cerr << fmt::format("\r[{}{}] {:5.1f}% {:.1f}/{:.1f} MB {:6.2f} MB/s {:>12L} tokens ",
                                 std::string(filled, '#'), std::string(width - filled, '.'), 100 * frac,
                                 done / 1e6, total / 1e6, done / 1e6 / secs, tokens)
                  << std::flush;
    }
    void done() {
        if (enabled_) std::cerr << "\n";
    }

private:
    bool enabled_;
    Clock::time_point start_;
};

struct Inputs {
    std::vector<std::string> train, eval;  // eval: files whose documents all go to eval.bin
};

std::vector<std::string> expand_all(const std::vector<std::string>& patterns, const std::string& flag) {
    std::vector<std::string> files;
    for (const std::string& p : patterns) {
        for (std::string& f : qtrain::expand_glob(p, flag)) files.push_back(std::move(f));
    }
    return files;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"tokenize: text or JSON Lines -> BIN.TOK token files (train.bin / eval.bin)"};
    std::string tokenizer_spec, out_dir, dataset, model = "qwen", download_dir = "data/downloads";
    std::vector<std::string> input_patterns, eval_patterns;
    qtrain::DocumentReaderOptions reader_options;
    double eval_fraction = -1;
    int64_t eval_tokens = -1, eval_documents = -1, shard_tokens = 100'000'000;
    int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::string special = "text", bos = "auto", eos = "auto";
    bool no_progress = false, list_datasets = false, chat = false;
    std::string chat_template_file, train_on = "assistant", python, template_kwargs = "{}";
    std::vector<std::string> end_of_turn;
    int64_t max_tokens = 0;

    app.add_option("--tokenizer", tokenizer_spec,
                   "tokenizer.json, qwen.tiktoken, a model directory, or a model name in the local "
                   "HF cache (default with --dataset: the --model's)");
    app.add_option("--input", input_patterns, "input files or globs: text, or JSON Lines (*.jsonl)");
    app.add_option("--eval-input", eval_patterns, "files or globs whose documents all go to eval.bin");
    app.add_option("--out-dir", out_dir, "output directory (default with --dataset: data/NAME-MODEL)");
    app.add_option("--dataset", dataset, "a named dataset to fetch and tokenize (--list-datasets)");
    app.add_option("--model", model, "model family for --dataset: qwen (= Qwen/Qwen2.5-0.5B) or a HF name")
        ->capture_default_str();
    app.add_option("--download-dir", download_dir, "where --dataset keeps downloaded files")->capture_default_str();
    app.add_flag("--list-datasets", list_datasets, "list the named datasets and exit");
    app.add_option("--doc-separator", reader_options.separator,
                   "text files: none (a file is a document), line, blank-line, or a literal string "
                   "such as '<|endoftext|>' (\\n \\t escapes allowed)")
        ->capture_default_str();
    app.add_option("--text-field", reader_options.text_field, "JSON Lines: the document's field (a.b for nested)")
        ->capture_default_str();
    app.add_option("--prompt-field", reader_options.prompt_field, "JSON Lines: prompt field (mask 0)");
    app.add_option("--response-field", reader_options.response_field, "JSON Lines: response field (mask 1, like EOS)");
    auto* frac_opt = app.add_option("--eval-fraction", eval_fraction,
                                    "documents starting in this first fraction of the input bytes go to eval.bin")
                         ->check(CLI::Range(0.0, 1.0));
    auto* tokens_opt = app.add_option("--eval-tokens", eval_tokens, "the first documents, until eval.bin has this many tokens")
                           ->excludes(frac_opt);
    // a corpus of known parts (the demo's 66 books) splits at a part: exactly the first N documents
    app.add_option("--eval-documents", eval_documents, "the first N documents go to eval.bin")
        ->excludes(frac_opt)
        ->excludes(tokens_opt)
        ->check(CLI::PositiveNumber);
    app.add_option("--shard-tokens", shard_tokens, "start a new train shard after this many tokens")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{1}, int64_t{2'000'000'000}));
    app.add_option("--threads", threads, "encoding threads (default: all cores)")->check(CLI::PositiveNumber);
    app.add_option("--special-tokens", special,
                   "special tokens such as <|im_start|> in the text: text (encode their characters; "
                   "non-special added tokens like <tool_call> still count, as HF split_special_tokens), "
                   "recognize (all added tokens), none (no added tokens)")
        ->capture_default_str()
        ->check(CLI::IsMember({"text", "recognize", "none"}));
    app.add_option("--bos", bos,
                   "token put before each document: auto (the one the tokenizer's post-processor adds, "
                   "e.g. Llama 3's <|begin_of_text|>; Qwen's adds none), none, or a token")
        ->capture_default_str();
    app.add_option("--eos", eos,
                   "token appended after each document: auto (<|endoftext|>, else Llama 3's "
                   "<|end_of_text|>), none, or a token")
        ->capture_default_str();
    app.add_flag("--no-progress", no_progress, "no progress bar on stderr");
    app.add_flag("--chat", chat,
                 "the JSON Lines inputs are conversations: records with `messages` (role/content; roles system, "
                 "user, assistant, tool; assistant tool_calls; an optional `tools` list) or `prompt`/`completion` "
                 "(a user and an assistant message), rendered with the model's chat template as transformers' "
                 "apply_chat_template(..., tokenize=True) does (ids equal). Each conversation is one document; "
                 "the files get loss masks and document starts. Needs python3 with jinja2 (see --python); one renderer "
                 "process per --threads");
    app.add_option("--chat-template", chat_template_file,
                   "--chat: a Jinja chat template file (default: chat_template.jinja in the tokenizer's directory, "
                   "else tokenizer_config.json's chat_template)");
    app.add_option("--train-on", train_on,
                   "--chat: which tokens are trained (mask 1): assistant (every assistant turn), last-assistant, "
                   "or all. A template with {% generation %} blocks: exactly the characters they emit (transformers' "
                   "return_assistant_tokens_mask). Otherwise each assistant turn runs from the end of the render of "
                   "the messages before it with add_generation_prompt=True (which must be a prefix of the whole "
                   "render) through the first end-of-turn token after it (or the end). A token is trained iff any "
                   "of its characters is in such a span")
        ->capture_default_str()
        ->check(CLI::IsMember({"assistant", "last-assistant", "all"}));
    app.add_option("--end-of-turn", end_of_turn,
                   "--chat: the tokens that end an assistant turn (default: tokenizer_config.json's eos_token and "
                   "those of <|im_end|>, <|eot_id|>, <|eom_id|> the tokenizer has)")
        ->delimiter(',');
    app.add_option("--max-tokens", max_tokens,
                   "--chat: cut a conversation after this many tokens; one whose trained tokens are all cut away "
                   "is skipped (and counted) (default 0: no limit)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--chat-template-kwargs", template_kwargs,
                   "--chat: extra template variables as a JSON object, as apply_chat_template's keyword arguments "
                   "(e.g. '{\"enable_thinking\": false}' for Qwen3); a record's own \"chat_template_kwargs\" "
                   "override them")
        ->capture_default_str();
    app.add_option("--python", python,
                   "--chat: the python3 that renders templates (needs jinja2; default: $QTRAIN_PYTHON, else python3)");
    CLI11_PARSE(app, argc, argv);

    try {
        if (list_datasets) {
            for (const qtrain::NamedDataset& d : qtrain::named_datasets()) {
                fmt::print("{:<18} {}\n", d.name, d.description);
            }
            return 0;
        }
        Inputs inputs;
        const qtrain::NamedDataset* named = nullptr;
        if (!dataset.empty()) {
            QT_CHECK(input_patterns.empty() && eval_patterns.empty(), "--dataset and --input exclude each other");
            named = &qtrain::find_named_dataset(dataset);
            if (app.count("--doc-separator") == 0) reader_options.separator = named->doc_separator;
            const bool has_eval_file = std::any_of(named->files.begin(), named->files.end(),
                                                   [](const auto& f) { return f.eval; });
            if (eval_fraction < 0 && eval_tokens < 0 && eval_documents < 0 && !has_eval_file)
                eval_fraction = named->eval_fraction;
            if (out_dir.empty()) out_dir = fmt::format("data/{}-{}", dataset, model);
        } else {
            QT_CHECK(!input_patterns.empty(), "no input: pass --input=FILES (or --dataset=NAME)");
            QT_CHECK(!tokenizer_spec.empty(),
                     "pass --tokenizer=PATH (tokenizer.json, qwen.tiktoken or a model directory)");
            inputs.train = expand_all(input_patterns, "--input");
            inputs.eval = expand_all(eval_patterns, "--eval-input");
        }
        QT_CHECK(!out_dir.empty(), "pass --out-dir=DIR");
        QT_CHECK(inputs.eval.empty() || (eval_fraction < 0 && eval_tokens < 0 && eval_documents < 0),
                 "--eval-input excludes --eval-fraction/--eval-tokens/--eval-documents");

        // The tokenizer first: a missing one fails before any download.
        const auto load_start = Clock::now();
        const qtrain::Tokenizer tokenizer =
            tokenizer_spec.empty() ? model_tokenizer(model, download_dir) : load_tokenizer(tokenizer_spec);
        if (named) {
            for (const auto& f : named->files) {
                (f.eval ? inputs.eval : inputs.train).push_back(qtrain::fetch_dataset_file(*named, f, download_dir));
            }
        }
        qtrain::BatchEncodeOptions encode_options;
        encode_options.threads = threads;
        encode_options.special = special == "recognize" ? qtrain::SpecialTokens::kRecognize
                                 : special == "none"    ? qtrain::SpecialTokens::kNone
                                                        : qtrain::SpecialTokens::kAsText;
        if (bos == "auto") {
            encode_options.bos_id = tokenizer.bos_id().value_or(-1);
        } else if (bos != "none") {
            const auto id = tokenizer.token_id(bos);
            QT_CHECK(id, "--bos: '", bos, "' is not a token of ", tokenizer.source());
            encode_options.bos_id = *id;
        }
        if (chat) eos = "none";  // the chat template ends each turn itself
        if (eos == "auto") {
            const auto end = tokenizer.end_of_text();
            QT_CHECK(end, "--eos=auto: ", tokenizer.source(),
                     " has neither <|endoftext|> nor <|end_of_text|>; pass --eos=TOKEN or --eos=none");
            eos = *end;
        }
        if (eos != "none") {
            const auto id = tokenizer.token_id(eos);
            QT_CHECK(id, "--eos: '", eos, "' is not a token of ", tokenizer.source());
            encode_options.eos_id = *id;
        }
        auto named_id = [&](int32_t id) {
            return id >= 0 ? fmt::format("{} = {}", tokenizer.decode(std::span(&id, 1)), id) : std::string("none");
        };
        std::cerr << fmt::format("tokenizer: {} ({} regular + {} added tokens, loaded in {:.2f} s); {}\n",
                                 tokenizer.source(), tokenizer.regular_vocab_size(),
                                 tokenizer.added_tokens().size(), seconds_since(load_start),
                                 chat ? std::string("BOS and end-of-turn tokens: the chat template's")
                                      : fmt::format("BOS {}; EOS {}", named_id(encode_options.bos_id),
                                                    named_id(encode_options.eos_id)));

        if (chat) {
            QT_CHECK(!tokenizer_spec.empty(), "--chat needs --tokenizer=PATH (its directory has the chat template)");
            QT_CHECK(reader_options.prompt_field.empty() && reader_options.response_field.empty(),
                     "--chat excludes --prompt-field/--response-field (a chat record's prompt/completion are read "
                     "as a user and an assistant message)");
            QT_CHECK(app.count("--bos") + app.count("--eos") + app.count("--special-tokens") + app.count("--text-field") +
                             app.count("--doc-separator") == 0,
                     "--bos, --eos, --special-tokens, --text-field and --doc-separator do not apply to --chat: the chat "
                     "template decides every token (its bos_token, end-of-turn tokens), and the render is tokenized "
                     "with all added tokens recognised, as transformers' apply_chat_template(..., tokenize=True) does");
            const qtrain::ChatTemplateInfo info = qtrain::load_chat_template(
                qtrain::resolve_tokenizer_path(tokenizer_spec, "--tokenizer"), chat_template_file);
            qtrain::ChatProcessOptions process_options;
            if (python.empty()) python = std::getenv("QTRAIN_PYTHON") ? std::getenv("QTRAIN_PYTHON") : "python3";
            process_options.python = python;
            process_options.template_text = info.text;
            process_options.special_tokens_json = info.special_tokens_json;
            process_options.end_of_turn = end_of_turn.empty() ? qtrain::default_end_of_turn(tokenizer, info.eos_token)
                                                              : end_of_turn;
            process_options.train_on = train_on;
            const auto kwargs = nlohmann::json::parse(template_kwargs, nullptr, false);
            QT_CHECK(!kwargs.is_discarded() && kwargs.is_object(), "--chat-template-kwargs: '", template_kwargs,
                     "' is not a JSON object");
            process_options.template_kwargs_json = kwargs.dump();
            // one renderer per thread: rendering (Python) and tokenizing share the cores
            const auto renderers = qtrain::start_chat_processes(process_options, threads);
            std::vector<qtrain::ChatProcess*> renderer_ptrs;
            for (const auto& r : renderers) renderer_ptrs.push_back(r.get());
            const qtrain::ChatProcess& renderer = *renderers.front();
            std::string eot_list;
            for (const auto& t : process_options.end_of_turn) eot_list += (eot_list.empty() ? "" : ", ") + t;
            if (eot_list.empty()) eot_list = "none (a turn runs to the end of the render; see --end-of-turn)";
            std::cerr << fmt::format("chat template: {} ({}); trained: {}\n", info.source,
                                     renderer.generation_blocks() ? "{% generation %} blocks"
                                                                  : "assistant turns through the end-of-turn token: " + eot_list,
                                     train_on);
            fs::create_directories(out_dir);
            SplitWriter writer(out_dir, tokenizer.vocab_size(), /*masks=*/true, shard_tokens, /*document_starts=*/true);
            ProgressBar progress(!no_progress && isatty(STDERR_FILENO));
            const auto start = Clock::now();
            int64_t eval_so_far = 0, docs = 0;
            uint64_t bytes = 0;
            qtrain::ChatStats total;
            std::vector<int64_t> train_lengths;  // for the fill rate packing will reach
            auto run_chat = [&](const std::vector<std::string>& files, bool all_eval) {
                qtrain::ChatReader reader(files, renderer_ptrs, tokenizer, max_tokens);
                const uint64_t eval_bytes =
                    eval_fraction > 0 ? static_cast<uint64_t>(eval_fraction * reader.total_bytes()) : 0;
                std::vector<qtrain::Conversation> batch;
                while (reader.read_batch(batch, 4u << 20)) {
                    for (auto& c : batch) {
                        const bool eval = all_eval || (eval_fraction > 0 && c.offset < eval_bytes) ||
                                          (eval_tokens > 0 && eval_so_far < eval_tokens) ||
                                          (eval_documents > 0 && docs < eval_documents);
                        qtrain::EncodedDocument doc{std::move(c.tokens.tokens), std::move(c.tokens.mask)};
                        writer.add(doc, eval);
                        if (eval) eval_so_far += static_cast<int64_t>(doc.tokens.size());
                        else train_lengths.push_back(static_cast<int64_t>(doc.tokens.size()));
                        ++docs;
                    }
                    batch.clear();
                    progress.update(bytes + reader.bytes_read(), bytes + reader.total_bytes(), total.tokens + reader.stats().tokens);
                }
                bytes += reader.total_bytes();
                const qtrain::ChatStats& s = reader.stats();
                total.records += s.records;
                total.conversations += s.conversations;
                total.skipped_no_assistant += s.skipped_no_assistant;
                total.skipped_cut += s.skipped_cut;
                total.truncated += s.truncated;
                total.tokens += s.tokens;
                total.trained += s.trained;
            };
            if (!inputs.eval.empty()) run_chat(inputs.eval, true);
            run_chat(inputs.train, false);
            progress.done();
            QT_CHECK(total.conversations > 0, "no conversation to train on in --input (", total.records, " records; ",
                     total.skipped_no_assistant, " without an assistant message, ", total.skipped_cut,
                     " with no trained token: cut away by --max-tokens, or none)");
            QT_CHECK(writer.has_train(), "no training data: every conversation went to eval.bin");
            const auto files = writer.finish();
            const double secs = std::max(1e-9, seconds_since(start));
            fmt::print("tokenize: {} conversations ({} records; skipped: {} without an assistant message, {} with "
                       "no trained token (beyond --max-tokens, or none); {} cut at --max-tokens) -> {} tokens, {} trained "
                       "({:.1f}%), in {:.2f} s\n",
                       total.conversations, total.records, total.skipped_no_assistant, total.skipped_cut,
                       total.truncated, total.tokens, total.trained,
                       total.tokens ? 100.0 * total.trained / total.tokens : 0.0, secs);
            for (const auto& [path, n] : files) fmt::print("  {}: {} tokens\n", path, n);
            // What train --document-masking (the loader's rule, io/row_packing.h) will make of them.
            std::string fills;
            for (int seq : {1024, 2048, 4096, 8192}) {
                qtrain::RowPacker packer(seq, false);
                int64_t split = 0;
                for (int64_t len : train_lengths) split += packer.add(len, [](int64_t, int64_t, bool) {});
                fills += fmt::format("{}{}: {:.1f}% ({} split)", fills.empty() ? "" : ", ", seq,
                                     100.0 * packer.fill_rate(), split);
            }
            fmt::print("packing the train conversations with document masking, fill rate (tokens / row slots) at "
                       "--seq-len {}\n", fills);
            return 0;
        }
        QT_CHECK(app.count("--chat-template") + app.count("--train-on") + app.count("--end-of-turn") +
                         app.count("--max-tokens") + app.count("--python") + app.count("--chat-template-kwargs") == 0,
                 "--chat-template, --chat-template-kwargs, --train-on, --end-of-turn, --max-tokens and --python go "
                 "with --chat");
        fs::create_directories(out_dir);
        const bool masks = !reader_options.prompt_field.empty();
        SplitWriter writer(out_dir, tokenizer.vocab_size(), masks, shard_tokens);
        ProgressBar progress(!no_progress && isatty(STDERR_FILENO));
        qtrain::BatchEncoder encoder(tokenizer, encode_options);
        const auto start = Clock::now();
        uint64_t docs = 0, bytes = 0, separator_hits = 0, text_files = 0;
        int64_t tokens = 0, eval_so_far = 0;
        double encode_secs = 0;  // of the total: the rest is reading, writing and syncing files
        const std::size_t batch_bytes = std::max<std::size_t>(4u << 20, static_cast<std::size_t>(threads) * (2u << 20));

        auto run = [&](const std::vector<std::string>& files, bool all_eval) {
            qtrain::DocumentReader reader(files, reader_options);
            const uint64_t eval_bytes =
                eval_fraction > 0 ? static_cast<uint64_t>(eval_fraction * reader.total_bytes()) : 0;
            std::vector<qtrain::Document> batch;
            while (reader.read_batch(batch, batch_bytes)) {
                const auto encode_start = Clock::now();
                const auto encoded = encoder.encode(batch, masks);
                encode_secs += seconds_since(encode_start);
                for (std::size_t i = 0; i < batch.size(); ++i) {
                    const bool eval = all_eval || (eval_fraction > 0 && batch[i].offset < eval_bytes) ||
                                      (eval_tokens > 0 && eval_so_far < eval_tokens) ||
                                      (eval_documents > 0 && docs + i < static_cast<uint64_t>(eval_documents));
                    writer.add(encoded[i], eval);
                    const auto n = static_cast<int64_t>(encoded[i].tokens.size());
                    tokens += n;
                    if (eval) eval_so_far += n;
                }
                docs += batch.size();
                batch.clear();
                progress.update(bytes + reader.bytes_read(), bytes + reader.total_bytes(), tokens);
            }
            bytes += reader.total_bytes();
            separator_hits += reader.separator_hits();
            text_files += reader.literal_separator() ? reader.text_files() : 0;
        };
        if (!inputs.eval.empty()) run(inputs.eval, true);
        run(inputs.train, false);
        progress.done();
        // Refused before anything is written (the unfinished files are removed, earlier ones kept):
        // a run that leaves no training data must not look like a success.
        const std::string input_desc = named ? cat("--dataset=", dataset)
                                             : cat("--input (", inputs.train.size() + inputs.eval.size(), " file",
                                                   inputs.train.size() + inputs.eval.size() == 1 ? "" : "s", ", ",
                                                   bytes, " bytes)");
        QT_CHECK(text_files == 0 || separator_hits > 0, "--doc-separator='", reader_options.separator,
                 "' never occurs in the ", text_files, " text file", text_files == 1 ? "" : "s", " of ", input_desc,
                 ", so each file would be one document (", docs, " in all). It is taken as a literal string; the "
                 "keywords are none (a file is a document), line and blank-line. Give one of them, or "
                 "--doc-separator=none to keep whole files");
        QT_CHECK(docs > 0, "no documents in ", input_desc, ": ",
                 bytes == 0 ? "the input is empty" : "every document is empty (or every JSON Lines line blank)",
                 "; nothing to tokenize");
        QT_CHECK(writer.has_train(), "no training data: ",
                 eval_documents > 0 ? cat("--eval-documents=", eval_documents)
                 : eval_tokens > 0  ? cat("--eval-tokens=", eval_tokens)
                 : eval_fraction > 0 ? cat("--eval-fraction=", eval_fraction)
                                     : std::string("--eval-input"),
                 " took all ", docs, " document", docs == 1 ? "" : "s", " (", tokens, " tokens) of ", input_desc,
                 " for eval.bin, leaving none for train.bin; give fewer to evaluation");
        const auto files = writer.finish();
        const double secs = std::max(1e-9, seconds_since(start));

        if (encoder.invalid_utf8()) {
            std::cerr << fmt::format("warning: {} invalid UTF-8 sequences were replaced by U+FFFD\n",
                                     encoder.invalid_utf8());
        }
        encode_secs = std::max(1e-9, encode_secs);
        fmt::print("tokenize: {} documents, {:.2f} MB -> {} tokens in {:.2f} s: {:.2f} MB/s, {:.2f} M tokens/s "
                   "({} threads; encoding alone {:.2f} s, {:.2f} MB/s)\n",
                   docs, bytes / 1e6, tokens, secs, bytes / 1e6 / secs, tokens / 1e6 / secs, threads,
                   encode_secs, bytes / 1e6 / encode_secs);
        for (const auto& [path, n] : files) fmt::print("  {}: {} tokens\n", path, n);
        if (files.empty()) fmt::print("  (no documents: nothing written)\n");
        return 0;
    } catch (const std::exception& e) {
        std::cerr << "tokenize: error: " << e.what() << "\n";
        return 1;
    }
}
