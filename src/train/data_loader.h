// Feeds micro-batches from BIN.TOK files. The data is cut into chunks of seq_len+1 tokens (chunks
// never cross files); each epoch visits every chunk once in an order shuffled by (seed, epoch).
// Inputs are a chunk's first seq_len tokens, targets the same shifted by one; a target whose mask
// bit is 0 becomes -1 (no loss). The state is two integers, so a checkpoint resumes exactly.
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

class DataLoader {
public:
    // `files`: token files (already glob-expanded). `what` names the flag for errors. Tokens are
    // checked against `model_vocab`. shuffle=false reads chunks in file order (evaluation).
    DataLoader(const std::vector<std::string>& files, int batch_size, int seq_len, uint64_t seed, bool shuffle,
               int model_vocab, const std::string& what);

    // Data parallel (issue 18, "one global order"): rank `rank` of `world` ranks. Every rank walks the
    // same sequence of chunks; each micro-batch consumes world x batch chunks of it, of which this
    // rank takes block `rank`. So micro-batch j of rank r is micro-batch j * world + r of one rank
    // with world x the accumulation: the same data whatever the world size, and a state (epoch,
    // position) that is the same on every rank. Default: rank 0 of 1.
    void set_rank(int rank, int world);

    // Fills B*T inputs and targets. Wraps into the next epoch when the current one runs out.
    void next_batch(std::vector<int32_t>& inputs, std::vector<int32_t>& targets);
    // Like next_batch but never wraps: returns false at the end of the epoch; a final partial batch
    // is padded with rows whose targets are all -1. Used for evaluation passes.
    bool next_batch_no_wrap(std::vector<int32_t>& inputs, std::vector<int32_t>& targets);

    DataLoaderState state() const { return state_; }
    void set_state(const DataLoaderState& s);
    void restart() { set_state({0, 0}); }

    int64_t num_chunks() const { return static_cast<int64_t>(chunks_.size()); }
    int64_t num_tokens() const { return total_tokens_; }
    int64_t batches_per_epoch() const { return num_chunks() / batch_size_; }
    // epoch + fraction of the current epoch consumed
    double epoch_progress() const;
    const std::vector<std::unique_ptr<TokenFile>>& files() const { return files_; }

private:
    struct Chunk {
        int32_t file;
        int64_t offset;
    };
    void build_order();
    void skip_chunks(int64_t n);           // advance by n chunks, wrapping like next_batch
    const Chunk& take_chunk();             // the next chunk, wrapping into the next epoch
    void fill_row(const Chunk& c, int32_t* in, int32_t* tgt) const;

    std::vector<std::unique_ptr<TokenFile>> files_;
    std::vector<Chunk> chunks_;    // file order
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
