// Reads training documents from text files and JSON Lines files, in order, a batch at a time, so
// inputs larger than memory stream through.
//
//  - Text files (any name not ending in .jsonl/.json): by default a whole file is one document.
//    With a separator, a file holds many: "line" (each line; its CR/LF dropped), "blank-line"
//    (documents are separated by one or more empty or whitespace-only lines; the separating
//    lines and the last line break of each document are dropped), or any literal string (C
//    escapes \n \r \t \\ understood), e.g. "<|endoftext|>" for TinyStories-style dumps. Empty
//    documents are skipped.
//  - JSON Lines files (*.jsonl, *.json): one JSON object per line; the document is the string at
//    `text_field` (a dotted path such as "meta.text" reaches into nested objects), or with
//    prompt/response fields both strings. Blank lines are skipped; anything else is an error that
//    names the file and line.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace qtrain {

struct Document {
    std::string text;      // the document (or, with prompt/response, the prompt)
    std::string response;  // only with prompt/response fields
    uint64_t offset = 0;   // where it starts in the whole input (bytes over all files, in order)
};

struct DocumentReaderOptions {
    std::string separator = "none";  // text files: none | line | blank-line | literal string
    std::string text_field = "text";
    std::string prompt_field, response_field;  // both set: documents are prompt + response
};

class DocumentReader {
public:
    DocumentReader(std::vector<std::string> files, DocumentReaderOptions options);
    ~DocumentReader();

    // Appends documents to `out` until about `max_bytes` of text were read; false at the end.
    bool read_batch(std::vector<Document>& out, std::size_t max_bytes);

    uint64_t total_bytes() const { return total_bytes_; }  // all input files
    uint64_t bytes_read() const { return done_bytes_ + file_pos_; }
    bool has_prompts() const { return !options_.prompt_field.empty(); }
    // A literal --doc-separator: how often it was found so far, and in how many text files it was
    // looked for (a literal that never occurs is a typo of a keyword more often than not).
    bool literal_separator() const { return !literal_separator_.empty(); }
    uint64_t separator_hits() const { return separator_hits_; }
    uint64_t text_files() const { return text_files_; }

private:
    bool open_next_file();
    bool read_more();  // appends a block of the current file to pending_; false at its end
    void take_text_documents(std::vector<Document>& out, bool at_end, std::size_t& taken);
    void take_jsonl_documents(std::vector<Document>& out, bool at_end, std::size_t& taken);
    void parse_json_line(std::string_view line, std::vector<Document>& out);

    std::vector<std::string> files_;
    DocumentReaderOptions options_;
    std::string literal_separator_;
    uint64_t total_bytes_ = 0, done_bytes_ = 0;
    uint64_t separator_hits_ = 0, text_files_ = 0;

    std::size_t next_file_ = 0;
    std::unique_ptr<std::ifstream> in_;
    bool jsonl_ = false;
    uint64_t file_pos_ = 0;      // bytes of the current file read into pending_
    std::string pending_;        // read but not yet turned into documents
    uint64_t pending_offset_ = 0;  // input offset of pending_[0]
    uint64_t line_no_ = 0;         // JSONL: lines consumed in the current file
    // blank-line mode: the document being assembled across reads
    std::string paragraph_;
    uint64_t paragraph_offset_ = 0;
};

}  // namespace qtrain
