// Encodes a batch of documents on several threads. Work is split below the document level too:
// a large document is cut where encoding restarts exactly (Tokenizer::split_for_parallel), so one
// big text file still keeps every thread busy. Output is in input order.
#pragma once

#include <cstdint>
#include <vector>

#include "tokenizer/document_reader.h"
#include "tokenizer/tokenizer.h"

namespace qtrain {

struct EncodedDocument {
    std::vector<int32_t> tokens;  // the document's tokens, then the end-of-document token
    std::vector<uint8_t> mask;    // with prompts: 0 for prompt tokens, 1 for response + EOS
};

struct BatchEncodeOptions {
    int threads = 1;
    int32_t eos_id = -1;  // appended after each document; < 0: nothing appended
    SpecialTokens special = SpecialTokens::kAsText;
    std::size_t chunk_bytes = 1u << 20;  // pieces of large documents handed to one thread
};

// Encodes `docs`; `stats` (if given) accumulates invalid UTF-8 replacements.
std::vector<EncodedDocument> encode_batch(const Tokenizer& tokenizer, const std::vector<Document>& docs,
                                          bool with_masks, const BatchEncodeOptions& options,
                                          EncodeStats* stats = nullptr);

}  // namespace qtrain
