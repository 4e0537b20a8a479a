// Encodes batches of documents on several threads. Work is split below the document level too:
// a large document is cut where encoding restarts exactly (Tokenizer::split_for_parallel), so one
// big text file still keeps every thread busy. The threads live as long as the encoder, so their
// piece caches stay warm from batch to batch. Output is in input order.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "tokenizer/document_reader.h"
#include "tokenizer/tokenizer.h"

namespace qtrain {

struct EncodedDocument {
    std::vector<int32_t> tokens;  // [BOS,] the document's tokens, then the end-of-document token
    std::vector<uint8_t> mask;    // with prompts: 0 for BOS and prompt tokens, 1 for response + EOS
};

struct BatchEncodeOptions {
    int threads = 1;
    int32_t bos_id = -1;  // put before each document (Tokenizer::bos_id()); < 0: nothing
    int32_t eos_id = -1;  // appended after each document; < 0: nothing appended
    SpecialTokens special = SpecialTokens::kAsText;
    std::size_t chunk_bytes = 1u << 20;  // pieces of large documents handed to one thread
};

class BatchEncoder {
public:
    BatchEncoder(const Tokenizer& tokenizer, BatchEncodeOptions options);
    ~BatchEncoder();
    BatchEncoder(const BatchEncoder&) = delete;
    BatchEncoder& operator=(const BatchEncoder&) = delete;

    // With masks, each document is its prompt (`text`, mask 0) then its response (mask 1).
    std::vector<EncodedDocument> encode(const std::vector<Document>& docs, bool with_masks);
    // Invalid UTF-8 sequences replaced so far.
    std::size_t invalid_utf8() const { return invalid_utf8_; }

private:
    struct WorkItem {
        std::size_t doc;
        uint8_t part;  // 0: the text (or prompt), 1: the response
        std::string_view text;
    };
    void work();  // encodes items until none is left
    void worker_loop();

    const Tokenizer& tokenizer_;
    BatchEncodeOptions options_;
    std::vector<std::thread> pool_;

    std::mutex mutex_;
    std::condition_variable start_, finished_;
    uint64_t generation_ = 0;
    int busy_ = 0;
    bool stop_ = false;

    // The batch being encoded.
    std::vector<WorkItem> items_;
    std::vector<std::vector<int32_t>> results_;
    std::size_t next_ = 0;  // guarded by mutex_
    std::exception_ptr error_;
    std::size_t invalid_utf8_ = 0;
};

}  // namespace qtrain
