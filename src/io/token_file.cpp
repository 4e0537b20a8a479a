// BIN.TOK token files: read by mmap (datasets can be many GB; the loader touches only what it uses),
// written through a temporary file whose header is filled in last, then renamed, so a crash or a
// full disk never leaves a file that looks complete.
#include "io/token_file.h"

#include <algorithm>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"

namespace qtrain {

static_assert(std::endian::native == std::endian::little, "BIN.TOK files are little-endian; so is the host code");

namespace {
constexpr std::size_t kHeaderInts = 256;
constexpr std::size_t kHeaderBytes = kHeaderInts * 4;
constexpr char kMagic[8] = {'B', 'I', 'N', '.', 'T', 'O', 'K', '\n'};

uint64_t mask_bytes(int64_t n) { return static_cast<uint64_t>(n + 7) / 8; }
}  // namespace

TokenFile::TokenFile(const std::string& path) : path_(path), file_(path, "token file") {
    const uint64_t file_size = file_.size();
    QT_CHECK(file_size >= kHeaderBytes, path, ": not a BIN.TOK token file: ", file_size,
             " bytes, shorter than the ", kHeaderBytes, "-byte header");
    {
        const unsigned char* bytes = file_.data();
        int32_t h[kHeaderInts];
        std::memcpy(h, bytes, kHeaderBytes);
        QT_CHECK(std::memcmp(bytes, kMagic, 8) == 0, path,
                 ": not a BIN.TOK token file (the first 8 bytes are not \"BIN.TOK\\n\")");
        QT_CHECK(h[2] == 1 || h[2] == 2, path, ": unsupported BIN.TOK version ", h[2], " (expected 1 or 2)");
        QT_CHECK(h[3] == 4, path, ": ", h[3], " bytes per token; qtrain reads 4-byte (int32) tokens only");
        QT_CHECK(h[4] >= 0, path, ": negative token count ", h[4], " in the header");
        header_.version = h[2];
        header_.bytes_per_token = h[3];
        header_.num_tokens = h[4];
        if (header_.version >= 2) {  // v1 has neither field: vocab unknown, no masks
            QT_CHECK(h[5] >= 0, path, ": negative vocab size ", h[5], " in the header");
            QT_CHECK(h[6] == 0 || h[6] == 1, path, ": has-masks field is ", h[6], " (expected 0 or 1)");
            QT_CHECK(h[7] == 0 || h[7] == 1, path, ": has-document-starts field is ", h[7], " (expected 0 or 1)");
            header_.vocab_size = h[5];
            header_.has_masks = h[6] == 1;
            header_.has_document_starts = h[7] == 1;
        } else {
            header_.vocab_size = 0;
            header_.has_masks = false;
            header_.has_document_starts = false;
        }
        const uint64_t n = static_cast<uint64_t>(header_.num_tokens);
        const uint64_t bits = mask_bytes(header_.num_tokens);
        const uint64_t expected = kHeaderBytes + 4 * n + (header_.has_masks ? bits : 0) +
                                  (header_.has_document_starts ? bits : 0);
        QT_CHECK(file_size == expected, path, ": file is ", file_size, " bytes but its header (", n, " tokens",
                 header_.has_masks ? " with masks" : "", header_.has_document_starts ? " with document starts" : "",
                 ") implies ", expected, " bytes (", file_size < expected ? "truncated?" : "trailing data?", ")");
        tokens_ = reinterpret_cast<const int32_t*>(bytes + kHeaderBytes);  // page-aligned + 1024: aligned
        if (header_.has_masks) masks_ = bytes + kHeaderBytes + 4 * n;
        if (header_.has_document_starts) doc_starts_ = bytes + kHeaderBytes + 4 * n + (header_.has_masks ? bits : 0);
    }
}

TokenFile::~TokenFile() = default;
TokenFile::TokenFile(TokenFile&& other) noexcept = default;

bool TokenFile::any_trained(int64_t begin, int64_t end) const {
    begin = std::max<int64_t>(begin, 0);
    end = std::min(end, header_.num_tokens);
    if (begin >= end) return false;
    if (!masks_) return true;
    int64_t i = begin;
    for (; i < end && (i & 7); ++i)
        if (mask(i)) return true;
    for (; i + 8 <= end; i += 8)  // whole bytes: a zero byte is eight masked tokens
        if (masks_[i >> 3]) return true;
    for (; i < end; ++i)
        if (mask(i)) return true;
    return false;
}

void TokenFile::validate_tokens(int vocab_size, const std::string& what) const {
    for (int64_t i = 0; i < header_.num_tokens; ++i) {
        const int32_t t = tokens_[i];
        QT_CHECK(t >= 0 && t < vocab_size, path_, ": token ", t, " at index ", i, " is outside [0, ", vocab_size,
                 ") (the limit is ", what, ")");
    }
}

// ---------------------------------------------------------------------------------------------

TokenFileWriter::TokenFileWriter(const std::string& path, int vocab_size, bool with_masks, bool with_document_starts)
    : path_(path), tmp_path_(path + ".tmp." + std::to_string(::getpid())), vocab_size_(vocab_size),
      with_masks_(with_masks), with_doc_starts_(with_document_starts) {
    QT_CHECK(vocab_size >= 0, path, ": vocab size must be >= 0 (0 = unknown), got ", vocab_size);
    std::filesystem::path p(path);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    FILE* f = std::fopen(tmp_path_.c_str(), "wb");
    QT_CHECK(f, "cannot open '", tmp_path_, "' for writing: ", std::strerror(errno));
    file_ = f;
    // Zeros now (no magic: an unfinished file is never mistaken for a valid one); finish() fills it.
    static const char zeros[kHeaderBytes] = {};
    if (std::fwrite(zeros, 1, kHeaderBytes, f) != kHeaderBytes) {
        std::fclose(f);
        file_ = nullptr;
        std::remove(tmp_path_.c_str());
        throw_error(cat("error writing '", path, "' (disk full?)"));
    }
}

TokenFileWriter::~TokenFileWriter() {
    if (file_) std::fclose(static_cast<FILE*>(file_));
    if (!finished_) std::remove(tmp_path_.c_str());
}

void TokenFileWriter::append(const int32_t* tokens, std::size_t n, const uint8_t* mask) {
    QT_CHECK(!finished_ && file_, path_, ": append after finish()");
    QT_CHECK(!with_masks_ || mask || n == 0, path_, ": this file has masks; append() needs one mask byte per token");
    QT_CHECK(with_masks_ || !mask, path_, ": a mask was given but the file was opened without masks");
    QT_CHECK(static_cast<uint64_t>(num_tokens_) + n <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max()),
             path_, ": more than ", std::numeric_limits<int32_t>::max(),
             " tokens; the BIN.TOK header stores the count as int32 (split the data over several files)");
    if (vocab_size_ > 0) {
        for (std::size_t i = 0; i < n; ++i)
            QT_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size_, path_, ": token ", tokens[i], " at index ",
                     num_tokens_ + static_cast<int64_t>(i), " is outside [0, ", vocab_size_, ") (the file's vocab size)");
    }
    QT_CHECK(n == 0 || std::fwrite(tokens, 4, n, static_cast<FILE*>(file_)) == n, "error writing '", path_,
             "' (disk full?)");
    if (with_masks_) {
        mask_bits_.resize(mask_bytes(num_tokens_ + static_cast<int64_t>(n)), 0);
        for (std::size_t i = 0; i < n; ++i) {
            const int64_t k = num_tokens_ + static_cast<int64_t>(i);
            if (mask[i]) mask_bits_[k >> 3] |= static_cast<uint8_t>(1u << (k & 7));  // LSB first
        }
    }
    num_tokens_ += static_cast<int64_t>(n);
}

void TokenFileWriter::start_document() {
    QT_CHECK(with_doc_starts_, path_, ": start_document() on a file opened without document starts");
    doc_start_bits_.resize(mask_bytes(num_tokens_ + 1), 0);
    doc_start_bits_[num_tokens_ >> 3] |= static_cast<uint8_t>(1u << (num_tokens_ & 7));
}

void TokenFileWriter::finish() {
    QT_CHECK(!finished_ && file_, path_, ": finish() called twice");
    FILE* f = static_cast<FILE*>(file_);
    mask_bits_.resize(with_masks_ ? mask_bytes(num_tokens_) : 0, 0);
    bool ok = mask_bits_.empty() || std::fwrite(mask_bits_.data(), 1, mask_bits_.size(), f) == mask_bits_.size();
    if (with_doc_starts_) {
        // A start marked after the last token (an empty last document) has no token to sit on.
        doc_start_bits_.resize(mask_bytes(num_tokens_), 0);
        if (num_tokens_ > 0) doc_start_bits_[0] |= 1u;
        if (num_tokens_ & 7) doc_start_bits_.back() &= static_cast<uint8_t>((1u << (num_tokens_ & 7)) - 1);
        ok = ok && (doc_start_bits_.empty() ||
                    std::fwrite(doc_start_bits_.data(), 1, doc_start_bits_.size(), f) == doc_start_bits_.size());
    }
    int32_t h[kHeaderInts] = {};
    std::memcpy(h, kMagic, 8);
    h[2] = 2;
    h[3] = 4;
    h[4] = static_cast<int32_t>(num_tokens_);
    h[5] = vocab_size_;
    h[6] = with_masks_ ? 1 : 0;
    h[7] = with_doc_starts_ ? 1 : 0;
    ok = ok && std::fseek(f, 0, SEEK_SET) == 0 && std::fwrite(h, 1, kHeaderBytes, f) == kHeaderBytes;
    ok = std::fflush(f) == 0 && ok;
    ok = ::fsync(::fileno(f)) == 0 && ok;
    ok = std::fclose(f) == 0 && ok;
    file_ = nullptr;
    QT_CHECK(ok, "error writing '", path_, "' (disk full?)");
    std::error_code ec;
    std::filesystem::rename(tmp_path_, path_, ec);
    QT_CHECK(!ec, "cannot rename '", tmp_path_, "' to '", path_, "': ", ec.message());
    finished_ = true;
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int vocab_size,
                      const std::vector<uint8_t>* mask, const std::vector<int64_t>* document_starts) {
    QT_CHECK(!mask || mask->size() == tokens.size(), path, ": ", tokens.size(), " tokens but ", mask->size(),
             " mask entries");
    TokenFileWriter w(path, vocab_size, mask != nullptr, document_starts != nullptr);
    std::size_t done = 0;
    auto append_to = [&](std::size_t end) {
        w.append(tokens.data() + done, end - done, mask ? mask->data() + done : nullptr);
        done = end;
    };
    if (document_starts) {
        for (int64_t s : *document_starts) {
            QT_CHECK(s >= static_cast<int64_t>(done) && s <= static_cast<int64_t>(tokens.size()), path,
                     ": document starts must be ascending token indices, got ", s);
            append_to(static_cast<std::size_t>(s));
            w.start_document();
        }
    }
    append_to(tokens.size());
    w.finish();
}

}  // namespace qtrain
