#include "train/data_loader.h"

#include "io/row_packing.h"

#include "core/error.h"
#include "core/rng.h"
#include "io/row_packing.h"

#include <algorithm>

namespace qtrain {

DataLoader::DataLoader(const std::vector<std::string>& files, int batch_size, int seq_len, uint64_t seed,
                       bool shuffle, int model_vocab, const std::string& what, const Packing& packing)
    : batch_size_(batch_size), seq_len_(seq_len), seed_(seed), shuffle_(shuffle), packing_(packing) {
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
        if (tf->has_masks()) masked_files.push_back(files[f]);
        if (!packing_.enabled) {
            // the chunks' targets are tokens 1 .. n_chunks * seq_len of the file
            any_trained = any_trained || tf->any_trained(1, n_chunks * seq_len + 1);
            for (int64_t c = 0; c < n_chunks; ++c) chunks_.push_back({static_cast<int32_t>(f), c * seq_len});
        }
        files_.push_back(std::move(tf));
    }
    if (packing_.enabled) {
        pack_files();
        any_trained = pack_.trained_targets > 0;
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

void DataLoader::pack_files() {
    RowPacker packer(seq_len_, packing_.one_per_row);  // io/row_packing.h: the rule, shared with tokenize
    for (std::size_t f = 0; f < files_.size(); ++f) {
        const TokenFile& tf = *files_[f];
        const int64_t n = tf.size();
        const bool starts = tf.has_document_starts();
        for (int64_t begin = 0; begin < n;) {
            // the document's end: the next document start, or just after the next EOS token
            int64_t end = begin + 1;
            if (starts) {
                while (end < n && !tf.document_start(end)) ++end;
            } else {
                while (end < n && tf.tokens()[end - 1] != packing_.eos_token_id) ++end;
            }
            ++pack_.documents;
            const bool split = packer.add(end - begin, [&](int64_t offset, int64_t length, bool new_row) {
                if (new_row) {  // the old row's tail stays padding
                    chunks_.push_back({-1, static_cast<int64_t>(segments_.size())});
                    row_valid_.push_back(0);
                }
                const int64_t piece = begin + offset;
                segments_.push_back({static_cast<int32_t>(f), static_cast<int32_t>(length), piece});
                int64_t valid = 0;  // the last token's target is another document's: none
                for (int64_t j = 1; j < length; ++j) valid += tf.mask(piece + j);
                row_valid_.back() += valid;
                pack_.trained_targets += valid;
                pack_.document_tokens += length;
            });
            pack_.split_documents += split;
            begin = end;
        }
    }
    pack_.rows = static_cast<int64_t>(chunks_.size());
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

void DataLoader::fill_row(const Chunk& c, int32_t* in, int32_t* tgt, int32_t* pos) const {
    if (packing_.enabled) {
        const std::size_t row = static_cast<std::size_t>(&c - chunks_.data());
        const int64_t seg_end = row + 1 < chunks_.size() ? chunks_[row + 1].offset : static_cast<int64_t>(segments_.size());
        int t = 0;
        for (int64_t i = c.offset; i < seg_end; ++i) {
            const Segment& sg = segments_[i];
            const TokenFile& f = *files_[sg.file];
            const int32_t* tok = f.tokens() + sg.begin;
            for (int j = 0; j < sg.length; ++j, ++t) {
                in[t] = tok[j];
                tgt[t] = j + 1 < sg.length && f.mask(sg.begin + j + 1) ? tok[j + 1] : -1;
                if (pos) pos[t] = j;
            }
        }
        // padding: a document of its own that carries no loss (its inputs are the EOS token, or 0)
        for (int j = 0; t < seq_len_; ++t, ++j) {
            in[t] = std::max(packing_.eos_token_id, 0);
            tgt[t] = -1;
            if (pos) pos[t] = j;
        }
        return;
    }
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

// With packing, the positions of the batch (sized B*T); else positions cleared and null.
static int32_t* positions_for(std::vector<int32_t>* positions, bool packed, std::size_t n) {
    if (!positions) return nullptr;
    if (!packed) {
        positions->clear();
        return nullptr;
    }
    positions->resize(n);
    return positions->data();
}

void DataLoader::next_batch(std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
                            std::vector<int32_t>* positions) {
    inputs.resize(static_cast<std::size_t>(batch_size_) * seq_len_);
    targets.resize(inputs.size());
    int32_t* pos = positions_for(positions, packing_.enabled, inputs.size());
    skip_chunks(static_cast<int64_t>(rank_) * batch_size_);  // the lower ranks' blocks
    for (int b = 0; b < batch_size_; ++b) {
        const std::size_t at = static_cast<std::size_t>(b) * seq_len_;
        fill_row(take_chunk(), inputs.data() + at, targets.data() + at, pos ? pos + at : nullptr);
    }
    skip_chunks(static_cast<int64_t>(world_ - 1 - rank_) * batch_size_);  // the higher ranks' blocks
}

bool DataLoader::next_batch_no_wrap(std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
                                    std::vector<int32_t>* positions) {
    if (state_.position >= num_chunks()) return false;
    inputs.assign(static_cast<std::size_t>(batch_size_) * seq_len_, 0);
    targets.assign(inputs.size(), -1);
    int32_t* pos = positions_for(positions, packing_.enabled, inputs.size());
    if (pos) {
        // the padding rows: each one document at positions 0..T-1
        for (std::size_t i = 0; i < inputs.size(); ++i) pos[i] = static_cast<int32_t>(i % seq_len_);
    }
    for (int b = 0; b < batch_size_ && state_.position < num_chunks(); ++b) {
        const Chunk& c = chunks_[order_[state_.position++]];
        const std::size_t at = static_cast<std::size_t>(b) * seq_len_;
        fill_row(c, inputs.data() + at, targets.data() + at, pos ? pos + at : nullptr);
    }
    return true;
}

int64_t DataLoader::valid_targets(const Chunk& c) const {
    if (packing_.enabled) return row_valid_[static_cast<std::size_t>(&c - chunks_.data())];
    const TokenFile& f = *files_[c.file];
    int64_t valid = 0;
    for (int t = 1; t <= seq_len_; ++t) valid += f.mask(c.offset + t);
    return valid;
}

int64_t DataLoader::valid_targets_ahead(int micro_batches) {
    // walk the rows as the ranks will (wrapping into the next epoch alike), then step back
    const DataLoaderState saved = state_;
    int64_t valid = 0;
    const int64_t rows = static_cast<int64_t>(micro_batches) * world_ * batch_size_;
    for (int64_t i = 0; i < rows; ++i) valid += valid_targets(take_chunk());
    set_state(saved);
    return valid;
}

double DataLoader::epoch_progress() const {
    return static_cast<double>(state_.epoch) + static_cast<double>(state_.position) / static_cast<double>(num_chunks());
}

}  // namespace qtrain
