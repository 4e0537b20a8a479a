// Feeds micro-batches from BIN.TOK files. The data is cut into chunks of seq_len+1 tokens (chunks
// never cross files); each epoch visits every chunk once in an order shuffled by (seed, epoch).
// Inputs are a chunk's first seq_len tokens, targets the same shifted by one; a target whose mask
// bit is 0 becomes -1 (no loss). The state is two integers, so a checkpoint resumes exactly.
//
// Packing (--document-masking, issue 31): the unit is a row of seq_len slots instead of a chunk.
// Documents come from the files' document starts, or without them end after each EOS token; they are
// packed greedily in file order, a document of L tokens taking L slots (inputs its tokens, targets
// the next token of the same document under the mask, -1 at its last token) and a document that does
// not fit the row's remaining space starting the next row (the tail is padding: targets -1, its own
// document). A document longer than seq_len is cut into pieces of seq_len, each its own document.
// Rows are what is shuffled per epoch, so the state, resume and set_rank work as with chunks; the
// batches also carry each token's position in its document (Batch::positions).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/token_file.h"

namespace qtrain {

struct DataLoaderState {
    int64_t epoch = 0;
    int64_t position = 0;  // chunks consumed in this epoch
};

// How a loader cuts the files into rows.
struct Packing {
    bool enabled = false;   // false: chunks of seq_len+1 tokens (bit-identical to before packing)
    int eos_token_id = -1;  // a document ends after it when a file has no document starts (< 0: none)
    bool one_per_row = false;  // every document (or piece) in a row of its own, the rest padding
};

// What packing made of the files (all zero without packing).
struct PackStats {
    int64_t documents = 0;       // documents found (before splitting)
    int64_t split_documents = 0; // documents longer than seq_len, cut into pieces
    int64_t rows = 0;
    int64_t document_tokens = 0; // slots holding a document's token (the rest is padding)
    int64_t trained_targets = 0; // slots with a target that carries loss (mask bit 1, not a document end)
    // document tokens / row slots: what packing did not waste on padding
    double fill_rate(int seq_len) const { return rows ? static_cast<double>(document_tokens) / (rows * seq_len) : 0.0; }
};

class DataLoader {
public:
    // `files`: token files (already glob-expanded). `what` names the flag for errors. Tokens are
    // checked against `model_vocab`. shuffle=false reads chunks in file order (evaluation).
    DataLoader(const std::vector<std::string>& files, int batch_size, int seq_len, uint64_t seed, bool shuffle,
               int model_vocab, const std::string& what, const Packing& packing = {});

    // Data parallel (issue 18, "one global order"): rank `rank` of `world` ranks. Every rank walks the
    // same sequence of chunks; each micro-batch consumes world x batch chunks of it, of which this
    // rank takes block `rank`. So micro-batch j of rank r is micro-batch j * world + r of one rank
    // with world x the accumulation: the same data whatever the world size, and a state (epoch,
    // position) that is the same on every rank. Default: rank 0 of 1.
    void set_rank(int rank, int world);

    // Fills B*T inputs and targets. Wraps into the next epoch when the current one runs out.
    // `positions` (optional): with packing, each token's position in its document (Batch::positions);
    // without packing it is left empty.
    void next_batch(std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
                    std::vector<int32_t>* positions = nullptr);
    // Like next_batch but never wraps: returns false at the end of the epoch; a final partial batch
    // is padded with rows whose targets are all -1. Used for evaluation passes.
    bool next_batch_no_wrap(std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
                            std::vector<int32_t>* positions = nullptr);
    // The valid targets (>= 0) of the next `micro_batches` micro-batches of every rank (world x batch
    // rows each, the global order of set_rank), without consuming them: the count every rank can make
    // alike for one optimizer step's loss normalisation (--loss-normalization=tokens).
    int64_t valid_targets_ahead(int micro_batches);

    DataLoaderState state() const { return state_; }
    void set_state(const DataLoaderState& s);
    void restart() { set_state({0, 0}); }

    // The units shuffled per epoch: chunks, or rows with packing.
    int64_t num_chunks() const { return static_cast<int64_t>(chunks_.size()); }
    bool packed() const { return packing_.enabled; }
    const PackStats& pack_stats() const { return pack_; }
    int64_t num_tokens() const { return total_tokens_; }
    int64_t batches_per_epoch() const { return num_chunks() / batch_size_; }
    // epoch + fraction of the current epoch consumed
    double epoch_progress() const;
    const std::vector<std::unique_ptr<TokenFile>>& files() const { return files_; }

private:
    // A chunk (file, offset), or with packing a row: segments_[offset .. next row's offset).
    struct Chunk {
        int32_t file;
        int64_t offset;
    };
    // With packing: one document (or piece) of a row, tokens [begin, begin + length) of a file.
    struct Segment {
        int32_t file;
        int32_t length;
        int64_t begin;
    };
    void build_order();
    void skip_chunks(int64_t n);           // advance by n chunks, wrapping like next_batch
    const Chunk& take_chunk();             // the next chunk, wrapping into the next epoch
    void fill_row(const Chunk& c, int32_t* in, int32_t* tgt, int32_t* pos) const;
    int64_t valid_targets(const Chunk& c) const;
    void pack_files();                     // rows of documents (Packing), counting pack_

    std::vector<std::unique_ptr<TokenFile>> files_;
    std::vector<Chunk> chunks_;    // file order
    std::vector<Segment> segments_;      // packing: every row's documents, rows in order
    std::vector<int64_t> row_valid_;     // packing: each row's valid targets
    Packing packing_;
    PackStats pack_;
    std::vector<int64_t> order_;   // this epoch's permutation of chunk indices
    int64_t order_epoch_ = -1;
    int batch_size_, seq_len_;
    uint64_t seed_;
    bool shuffle_;
    int rank_ = 0, world_ = 1;
    int64_t total_tokens_ = 0;
    DataLoaderState state_;
};

}  // namespace qtrain
