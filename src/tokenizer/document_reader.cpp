#include "tokenizer/document_reader.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace qtrain {
namespace {

constexpr std::size_t kBlockBytes = 16u << 20;

std::string unescape(const std::string& s) {
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '\\' || i + 1 == s.size()) {
            out += s[i];
            continue;
        }
        switch (s[++i]) {
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case '\\': out += '\\'; break;
            default: out += '\\'; out += s[i];
        }
    }
    return out;
}

bool is_blank(std::string_view line) {
    return line.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos;
}

// "a, b, c": the top-level fields of a JSON object, for error messages.
std::string field_names(const nlohmann::json& j) {
    if (!j.is_object()) return "the line is not a JSON object";
    std::string names;
    for (auto it = j.begin(); it != j.end(); ++it) names += (names.empty() ? "" : ", ") + it.key();
    return "top-level fields: " + names;
}

bool is_jsonl(const std::string& path) {
    return path.ends_with(".jsonl") || path.ends_with(".json");
}

}  // namespace

DocumentReader::DocumentReader(std::vector<std::string> files, DocumentReaderOptions options)
    : files_(std::move(files)), options_(std::move(options)) {
    QT_CHECK(options_.prompt_field.empty() == options_.response_field.empty(),
             "--prompt-field and --response-field go together (prompt tokens get mask 0, "
             "response tokens mask 1)");
    const std::string& sep = options_.separator;
    if (sep != "none" && sep != "line" && sep != "blank-line") {
        literal_separator_ = unescape(sep);
        QT_CHECK(!literal_separator_.empty(), "--doc-separator must not be empty");
    }
    for (const std::string& f : files_) {
        std::error_code ec;
        QT_CHECK(std::filesystem::is_regular_file(f, ec), "input '", f,
                 "' does not exist or is not a file");
        total_bytes_ += std::filesystem::file_size(f, ec);
        QT_CHECK(!has_prompts() || is_jsonl(f), "input '", f,
                 "': --prompt-field/--response-field need JSON Lines files (*.jsonl)");
    }
}

DocumentReader::~DocumentReader() = default;

bool DocumentReader::open_next_file() {
    if (next_file_ >= files_.size()) return false;
    const std::string& path = files_[next_file_++];
    in_ = std::make_unique<std::ifstream>(path, std::ios::binary);
    QT_CHECK(in_->good(), "cannot open input '", path, "'");
    jsonl_ = is_jsonl(path);
    text_files_ += jsonl_ ? 0 : 1;
    file_pos_ = 0;
    line_no_ = 0;
    pending_.clear();
    pending_offset_ = done_bytes_;
    paragraph_.clear();
    return true;
}

bool DocumentReader::read_more() {
    const std::size_t old = pending_.size();
    pending_.resize(old + kBlockBytes);
    in_->read(pending_.data() + old, static_cast<std::streamsize>(kBlockBytes));
    const auto got = static_cast<std::size_t>(in_->gcount());
    pending_.resize(old + got);
    file_pos_ += got;
    QT_CHECK(!in_->bad(), "error reading input '", files_[next_file_ - 1], "'");
    return got == kBlockBytes;
}

void DocumentReader::take_text_documents(std::vector<Document>& out, bool at_end,
                                         std::size_t& taken) {
    auto emit = [&](std::string text, uint64_t offset) {
        if (text.empty()) return;
        taken += text.size();
        out.push_back(Document{std::move(text), {}, offset});
    };
    const std::string& mode = options_.separator;
    std::size_t consumed = 0;
    if (mode == "none") {
        if (at_end) {
            emit(std::move(pending_), pending_offset_);
            pending_.clear();
            pending_offset_ += file_pos_;
        }
        return;
    }
    if (!literal_separator_.empty()) {
        const std::string& sep = literal_separator_;
        for (std::size_t hit; (hit = pending_.find(sep, consumed)) != std::string::npos;) {
            emit(pending_.substr(consumed, hit - consumed), pending_offset_ + consumed);
            consumed = hit + sep.size();
            ++separator_hits_;
        }
    } else {
        for (std::size_t nl; (nl = pending_.find('\n', consumed)) != std::string::npos;) {
            std::string_view line(pending_.data() + consumed, nl + 1 - consumed);
            const uint64_t offset = pending_offset_ + consumed;
            consumed = nl + 1;
            if (mode == "line") {
                line.remove_suffix(1);
                if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
                emit(std::string(line), offset);
            } else if (is_blank(line)) {  // blank-line mode
                while (!paragraph_.empty() && (paragraph_.back() == '\n' || paragraph_.back() == '\r')) {
                    paragraph_.pop_back();
                }
                emit(std::move(paragraph_), paragraph_offset_);
                paragraph_.clear();
            } else {
                if (paragraph_.empty()) paragraph_offset_ = offset;
                paragraph_.append(line);
            }
        }
    }
    if (at_end) {  // the rest of the file has no separator after it
        std::string rest = pending_.substr(consumed);
        const uint64_t offset = pending_offset_ + consumed;
        if (mode == "blank-line") {
            if (paragraph_.empty()) paragraph_offset_ = offset;
            paragraph_ += is_blank(rest) ? std::string() : rest;
            while (!paragraph_.empty() && (paragraph_.back() == '\n' || paragraph_.back() == '\r')) {
                paragraph_.pop_back();
            }
            emit(std::move(paragraph_), paragraph_offset_);
            paragraph_.clear();
        } else {
            if (mode == "line" && !rest.empty() && rest.back() == '\r') rest.pop_back();
            emit(std::move(rest), offset);
        }
        consumed = pending_.size();
    }
    pending_.erase(0, consumed);
    pending_offset_ += consumed;
}

void DocumentReader::parse_json_line(std::string_view line, std::vector<Document>& out) {
    const std::string where = cat(files_[next_file_ - 1], ":", line_no_);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
        throw_error(cat(where, ": not valid JSON (", e.what(), ")"));
    }
    auto field = [&](const std::string& path) -> std::string {
        const nlohmann::json* node = &j;
        std::size_t start = 0;
        while (true) {
            const std::size_t dot = path.find('.', start);
            const std::string key = path.substr(start, dot == std::string::npos ? dot : dot - start);
            QT_CHECK(node->is_object() && node->contains(key), where, ": no field '", path, "' (",
                     field_names(j), ")");
            node = &(*node)[key];
            if (dot == std::string::npos) break;
            start = dot + 1;
        }
        QT_CHECK(node->is_string(), where, ": field '", path, "' is not a string");
        return node->get<std::string>();
    };
    Document d;
    if (has_prompts()) {
        d.text = field(options_.prompt_field);
        d.response = field(options_.response_field);
    } else {
        d.text = field(options_.text_field);
    }
    out.push_back(std::move(d));
}

void DocumentReader::take_jsonl_documents(std::vector<Document>& out, bool at_end,
                                          std::size_t& taken) {
    std::size_t consumed = 0;
    auto take_line = [&](std::size_t end, std::size_t next) {
        ++line_no_;
        const std::string_view line(pending_.data() + consumed, end - consumed);
        const uint64_t offset = pending_offset_ + consumed;
        consumed = next;
        if (is_blank(line)) return;
        parse_json_line(line, out);
        out.back().offset = offset;
        taken += out.back().text.size() + out.back().response.size();
    };
    for (std::size_t nl; (nl = pending_.find('\n', consumed)) != std::string::npos;) {
        take_line(nl, nl + 1);
    }
    if (at_end && consumed < pending_.size()) take_line(pending_.size(), pending_.size());
    pending_.erase(0, consumed);
    pending_offset_ += consumed;
}

bool DocumentReader::read_batch(std::vector<Document>& out, std::size_t max_bytes) {
    const std::size_t before = out.size();
    std::size_t taken = 0;
    while (taken < max_bytes) {
        if (!in_ && !open_next_file()) break;
        const bool at_end = !read_more();
        if (jsonl_) {
            take_jsonl_documents(out, at_end, taken);
        } else {
            take_text_documents(out, at_end, taken);
        }
        if (at_end) {
            done_bytes_ += file_pos_;
            file_pos_ = 0;
            in_.reset();
        }
    }
    return out.size() > before;
}

}  // namespace qtrain
