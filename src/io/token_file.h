// BIN.TOK token files (llm.q's format, so existing data works). Version 2 layout: a 1024-byte header
// of 256 little-endian int32 — bytes 0..7 "BIN.TOK\n", [2] version (1 or 2), [3] bytes per token
// (must be 4), [4] token count, [5] vocab size (v2; 0 = unknown in v1), [6] has-masks (v2), [7]
// has-document-starts (v2, qtrain's addition; 0 in llm.q's files) — then int32 tokens, then (if
// masks) one bit per token, LSB first, then (if document starts) one bit per token likewise. Mask
// bit 1 = train on this token (e.g. a response), 0 = no loss (prompt). Document-start bit 1 = a
// document (a conversation, a text) begins at this token; packing with document masking cuts rows
// there (without them, after each EOS token).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/mapped_file.h"

namespace qtrain {

struct TokenFileHeader {
    int version = 2;
    int bytes_per_token = 4;
    int64_t num_tokens = 0;
    int vocab_size = 0;
    bool has_masks = false;
    bool has_document_starts = false;
};

// A memory-mapped token file. The constructor validates magic, version, bytes per token and that
// the file size matches header + tokens (+ masks); every error names the file.
class TokenFile {
public:
    explicit TokenFile(const std::string& path);
    ~TokenFile();
    TokenFile(TokenFile&& other) noexcept;
    TokenFile& operator=(TokenFile&&) = delete;
    TokenFile(const TokenFile&) = delete;

    const std::string& path() const { return path_; }
    const TokenFileHeader& header() const { return header_; }
    int64_t size() const { return header_.num_tokens; }
    const int32_t* tokens() const { return tokens_; }
    bool has_masks() const { return header_.has_masks; }
    // true when token i contributes to the loss (always true without masks).
    bool mask(int64_t i) const {
        return !masks_ || ((masks_[i >> 3] >> (i & 7)) & 1);
    }
    bool has_document_starts() const { return header_.has_document_starts; }
    // true when a document begins at token i (false everywhere without document starts).
    bool document_start(int64_t i) const {
        return doc_starts_ && ((doc_starts_[i >> 3] >> (i & 7)) & 1);
    }
    // Whether any token in [begin, end) has mask bit 1 (always, without masks); stops at the first.
    bool any_trained(int64_t begin, int64_t end) const;
    // Checks every token is in [0, vocab_size); throws naming the file, the position, the token
    // and the limit (`what` says where the limit comes from, e.g. "the model's vocab_size").
    void validate_tokens(int vocab_size, const std::string& what) const;

private:
    std::string path_;
    TokenFileHeader header_;
    MappedFile file_;
    const int32_t* tokens_ = nullptr;
    const uint8_t* masks_ = nullptr;
    const uint8_t* doc_starts_ = nullptr;
};

// Writes a token file incrementally (header patched at finish; temp file renamed into place).
class TokenFileWriter {
public:
    TokenFileWriter(const std::string& path, int vocab_size, bool with_masks, bool with_document_starts = false);
    ~TokenFileWriter();  // abandons (deletes the temp file) if finish() was not called
    TokenFileWriter(const TokenFileWriter&) = delete;
    TokenFileWriter& operator=(const TokenFileWriter&) = delete;

    // `mask` (one byte per token, nonzero = train) is required iff the file has masks.
    void append(const int32_t* tokens, std::size_t n, const uint8_t* mask = nullptr);
    // Files with document starts: the next token appended begins a document. The first token of the
    // file always does (finish() marks it).
    void start_document();
    int64_t num_tokens() const { return num_tokens_; }
    void finish();

private:
    std::string path_, tmp_path_;
    int vocab_size_;
    bool with_masks_, with_doc_starts_;
    void* file_ = nullptr;  // FILE*
    int64_t num_tokens_ = 0;
    std::vector<uint8_t> mask_bits_, doc_start_bits_;
    bool finished_ = false;
};

// Convenience: whole file in one call.
// `document_starts` (token indices, ascending) gives the file document starts.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int vocab_size,
                      const std::vector<uint8_t>* mask = nullptr, const std::vector<int64_t>* document_starts = nullptr);

}  // namespace qtrain
