#include "tokenizer/chat_reader.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <iostream>
#include <thread>

#include "core/error.h"

namespace qtrain {
namespace {
constexpr int64_t kWarnings = 5;  // skipped records named one by one; the summary counts them all
}  // namespace

ChatReader::ChatReader(std::vector<std::string> files, std::vector<ChatProcess*> renderers, const Tokenizer& tokenizer,
                       int64_t max_tokens)
    : files_(std::move(files)), renderers_(std::move(renderers)), tokenizer_(tokenizer), max_tokens_(max_tokens) {
    QT_CHECK(!renderers_.empty(), "ChatReader: no renderer");
    for (const std::string& f : files_) {
        std::error_code ec;
        const auto size = std::filesystem::file_size(f, ec);
        QT_CHECK(!ec, "cannot read ", f, ": ", ec.message());
        total_bytes_ += size;
    }
}

ChatReader::~ChatReader() = default;

bool ChatReader::open_next_file() {
    if (in_) done_bytes_ += file_pos_;
    in_.reset();
    file_pos_ = 0;
    line_no_ = 0;
    format_.clear();
    if (next_file_ >= files_.size()) return false;
    in_ = std::make_unique<std::ifstream>(files_[next_file_++], std::ios::binary);
    QT_CHECK(in_->good(), "cannot open ", files_[next_file_ - 1]);
    return true;
}

bool ChatReader::read_batch(std::vector<Conversation>& out, std::size_t max_bytes) {
    struct Line {
        uint64_t line_no, offset;
    };
    std::vector<std::string> records;
    std::vector<Line> where;
    std::size_t bytes = 0;
    std::string file;
    while (bytes < max_bytes) {
        if (!in_ && !open_next_file()) break;
        std::string line;
        if (!std::getline(*in_, line)) {
            if (!open_next_file()) break;
            if (!records.empty()) break;  // a batch stays within one file (errors name it)
            continue;
        }
        const uint64_t offset = done_bytes_ + file_pos_;
        file_pos_ += line.size() + (in_->eof() ? 0 : 1);
        ++line_no_;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        file = files_[next_file_ - 1];
        bytes += line.size();
        where.push_back({line_no_, offset});
        records.push_back(std::move(line));
    }
    if (records.empty()) return false;
    // one contiguous piece per renderer: its thread renders, then tokenizes what it rendered
    const std::size_t pieces = std::min(renderers_.size(), records.size());
    std::vector<RenderedChat> rendered(records.size());
    std::vector<ChatTokens> tokens(records.size());
    std::vector<std::exception_ptr> errors(pieces);
    auto work = [&](std::size_t p) {
        try {
            const std::size_t begin = records.size() * p / pieces, end = records.size() * (p + 1) / pieces;
            const std::vector<std::string> mine(std::make_move_iterator(records.begin() + begin),
                                                std::make_move_iterator(records.begin() + end));
            std::vector<RenderedChat> done = renderers_[p]->render(mine);
            for (std::size_t i = begin; i < end; ++i) {
                rendered[i] = std::move(done[i - begin]);
                if (rendered[i].error.empty() && rendered[i].skip.empty()) {
                    tokens[i] = tokenize_chat(tokenizer_, rendered[i], max_tokens_);
                }
            }
        } catch (...) {
            errors[p] = std::current_exception();
        }
    };
    std::vector<std::thread> pool;
    for (std::size_t p = 1; p < pieces; ++p) pool.emplace_back(work, p);
    work(0);
    for (auto& th : pool) th.join();
    for (auto& e : errors) {
        if (e) std::rethrow_exception(e);
    }
    stats_.records += static_cast<int64_t>(records.size());

    // checks in input order, so the first bad line is the one reported
    for (std::size_t i = 0; i < rendered.size(); ++i) {
        const RenderedChat& r = rendered[i];
        QT_CHECK(r.error.empty(), file, ":", where[i].line_no, ": ", r.error);
        if (format_.empty()) {
            format_ = r.format;
            format_line_ = where[i].line_no;
        }
        QT_CHECK(r.format == format_, file, ":", where[i].line_no, ": a ", r.format, " record in a file of ", format_,
                 " records (line ", format_line_, "); one file holds one format");
    }

    for (std::size_t i = 0; i < rendered.size(); ++i) {
        if (!rendered[i].skip.empty()) {
            // (the other reason: a template whose generation blocks emit nothing, i.e. nothing to train)
            const bool no_assistant = rendered[i].skip == "no assistant message";
            if (++(no_assistant ? stats_.skipped_no_assistant : stats_.skipped_cut) <= kWarnings) {
                std::cerr << "tokenize: skipped " << file << ":" << where[i].line_no << ": " << rendered[i].skip << "\n";
            }
            continue;
        }
        const int64_t trained = tokens[i].trained();
        if (trained == 0) {
            // the assistant part lies beyond max_tokens (or is empty): no loss to take from it
            if (++stats_.skipped_cut <= kWarnings) {
                std::cerr << "tokenize: skipped " << file << ":" << where[i].line_no << ": no trained token within "
                          << (tokens[i].truncated ? "--max-tokens" : "the conversation") << "\n";
            }
            continue;
        }
        stats_.truncated += tokens[i].truncated ? 1 : 0;
        ++stats_.conversations;
        stats_.tokens += static_cast<int64_t>(tokens[i].tokens.size());
        stats_.trained += trained;
        out.push_back({std::move(tokens[i]), where[i].offset});
    }
    return true;
}

}  // namespace qtrain
