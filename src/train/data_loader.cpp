#include "train/data_loader.h"

#include "core/error.h"
#include "core/rng.h"

namespace qtrain {

DataLoader::DataLoader(const std::vector<std::string>& files, int batch_size, int seq_len, uint64_t seed,
                       bool shuffle, int model_vocab, const std::string& what)
    : batch_size_(batch_size), seq_len_(seq_len), seed_(seed), shuffle_(shuffle) {
    QT_CHECK(!files.empty(), what, ": no token files");
    bool any_trained = false;
    std::vector<std::string> masked_files;
    for (std::size_t f = 0; f < files.size(); ++f) {
        auto tf = std::make_unique<TokenFile>(files[f]);
        const auto& h = tf->header();
        QT_CHECK(h.vocab_size <= model_vocab, what, ": '", files[f], "' was tokenized with vocab size ", h.vocab_size,
                 " but the model has vocab_size ", model_vocab, " (wrong tokenizer for this model?)");
        tf->validate_tokens(model_vocab, "the model's vocab_size");
        total_tokens_ += tf->size();
        const int64_t n_chunks = tf->size() > 0 ? (tf->size() - 1) / seq_len : 0;
        // the chunks' targets are tokens 1 .. n_chunks * seq_len of the file
        any_trained = any_trained || tf->any_trained(1, n_chunks * seq_len + 1);
        if (tf->has_masks()) masked_files.push_back(files[f]);
        for (int64_t c = 0; c < n_chunks; ++c) chunks_.push_back({static_cast<int32_t>(f), c * seq_len});
        files_.push_back(std::move(tf));
    }
    QT_CHECK(!chunks_.empty(), what, ": the token files hold ", total_tokens_, " tokens, too few for one sequence of --seq-len=",
             seq_len, " (+1 for the shifted target)");
    // Every target masked: a run would go to the end learning nothing and export the model it started with.
    if (!any_trained) {
        std::string list;
        for (std::size_t i = 0; i < masked_files.size() && i < 4; ++i) list += cat(i ? ", '" : "'", masked_files[i], "'");
        if (masked_files.size() > 4) list += cat(", ... (", masked_files.size(), " files)");
        throw_error(cat(what, ": every target token of ", list, " is masked (mask bit 0: no loss), so there is nothing ",
                        what == "--eval-file" ? "to evaluate" : "to train on",
                        ". Were they tokenized with the response field as the prompt (tokenize --prompt-field / "
                        "--response-field)? Re-tokenize, or give files with trained tokens"));
    }
    build_order();
}

void DataLoader::build_order() {
    order_.resize(chunks_.size());
    for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int64_t>(i);
    if (shuffle_) {
        // Fisher-Yates with our own RNG: the same order on every platform.
        uint64_t s = seed_ ^ (0x5eedda7aull + static_cast<uint64_t>(state_.epoch) * 0x9e3779b97f4a7c15ull);
        Rng rng(splitmix64(s));
        for (std::size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
    }
    order_epoch_ = state_.epoch;
}

void DataLoader::set_state(const DataLoaderState& s) {
    QT_CHECK(s.epoch >= 0 && s.position >= 0 && s.position <= num_chunks(), "data loader state out of range (epoch ",
             s.epoch, ", position ", s.position, ", ", num_chunks(), " chunks): checkpoint from different data?");
    state_ = s;
    if (order_epoch_ != state_.epoch) build_order();
}

void DataLoader::fill_row(const Chunk& c, int32_t* in, int32_t* tgt) const {
    const TokenFile& f = *files_[c.file];
    const int32_t* tok = f.tokens() + c.offset;
    for (int t = 0; t < seq_len_; ++t) {
        in[t] = tok[t];
        tgt[t] = f.mask(c.offset + t + 1) ? tok[t + 1] : -1;
    }
}

void DataLoader::set_rank(int rank, int world) {
    QT_CHECK(world >= 1 && rank >= 0 && rank < world, "data loader: rank ", rank, " of ", world, " ranks");
    rank_ = rank;
    world_ = world;
}

const DataLoader::Chunk& DataLoader::take_chunk() {
    if (state_.position >= num_chunks()) set_state({state_.epoch + 1, 0});  // lazily, as one rank would
    return chunks_[order_[state_.position++]];
}

void DataLoader::skip_chunks(int64_t n) {
    for (int64_t i = 0; i < n; ++i) (void)take_chunk();
}

void DataLoader::next_batch(std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
    inputs.resize(static_cast<std::size_t>(batch_size_) * seq_len_);
    targets.resize(inputs.size());
    skip_chunks(static_cast<int64_t>(rank_) * batch_size_);  // the lower ranks' blocks
    for (int b = 0; b < batch_size_; ++b)
        fill_row(take_chunk(), inputs.data() + static_cast<std::size_t>(b) * seq_len_,
                 targets.data() + static_cast<std::size_t>(b) * seq_len_);
    skip_chunks(static_cast<int64_t>(world_ - 1 - rank_) * batch_size_);  // the higher ranks' blocks
}

bool DataLoader::next_batch_no_wrap(std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
    if (state_.position >= num_chunks()) return false;
    inputs.assign(static_cast<std::size_t>(batch_size_) * seq_len_, 0);
    targets.assign(inputs.size(), -1);
    for (int b = 0; b < batch_size_ && state_.position < num_chunks(); ++b) {
        const Chunk& c = chunks_[order_[state_.position++]];
        fill_row(c, inputs.data() + static_cast<std::size_t>(b) * seq_len_, targets.data() + static_cast<std::size_t>(b) * seq_len_);
    }
    return true;
}

double DataLoader::epoch_progress() const {
    return static_cast<double>(state_.epoch) + static_cast<double>(state_.position) / static_cast<double>(num_chunks());
}

}  // namespace qtrain
