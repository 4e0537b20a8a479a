#include "tokenizer/batch_encoder.h"

namespace qtrain {

BatchEncoder::BatchEncoder(const Tokenizer& tokenizer, BatchEncodeOptions options)
    : tokenizer_(tokenizer), options_(options) {
    for (int t = 1; t < options_.threads; ++t) pool_.emplace_back([this] { worker_loop(); });
}

BatchEncoder::~BatchEncoder() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : pool_) t.join();
}

void BatchEncoder::work() {
    EncodeStats stats;
    while (true) {
        std::size_t i;
        {
            // Items are coarse (a document or a ~1 MB piece), so a lock per item costs nothing.
            std::lock_guard<std::mutex> lock(mutex_);
            if (next_ >= items_.size()) break;
            i = next_++;
        }
        try {
            tokenizer_.encode(items_[i].text, results_[i], options_.special, &stats);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!error_) error_ = std::current_exception();
            next_ = items_.size();
        }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    invalid_utf8_ += stats.invalid_utf8;
}

void BatchEncoder::worker_loop() {
    uint64_t seen = 0;
    while (true) {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            start_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
        }
        work();
        {
            std::lock_guard<std::mutex> lock(mutex_);
            --busy_;
        }
        finished_.notify_all();
    }
}

std::vector<EncodedDocument> BatchEncoder::encode(const std::vector<Document>& docs, bool with_masks) {
    items_.clear();
    for (std::size_t d = 0; d < docs.size(); ++d) {
        for (const std::string_view chunk : tokenizer_.split_for_parallel(docs[d].text, options_.chunk_bytes)) {
            items_.push_back({d, 0, chunk});
        }
        if (with_masks) items_.push_back({d, 1, docs[d].response});
    }
    results_.assign(items_.size(), {});
    {
        std::lock_guard<std::mutex> lock(mutex_);
        next_ = 0;
        error_ = nullptr;
        busy_ = static_cast<int>(pool_.size());
        ++generation_;
    }
    start_.notify_all();
    work();  // this thread helps
    {
        std::unique_lock<std::mutex> lock(mutex_);
        finished_.wait(lock, [&] { return busy_ == 0; });
    }
    if (error_) std::rethrow_exception(error_);

    std::vector<EncodedDocument> out(docs.size());
    if (options_.bos_id >= 0) {
        for (EncodedDocument& e : out) {
            e.tokens.push_back(options_.bos_id);
            if (with_masks) e.mask.push_back(0);
        }
    }
    for (std::size_t i = 0; i < items_.size(); ++i) {
        EncodedDocument& e = out[items_[i].doc];
        e.tokens.insert(e.tokens.end(), results_[i].begin(), results_[i].end());
        if (with_masks) e.mask.resize(e.tokens.size(), items_[i].part);
    }
    if (options_.eos_id >= 0) {
        for (EncodedDocument& e : out) {
            e.tokens.push_back(options_.eos_id);
            if (with_masks) e.mask.push_back(1);
        }
    }
    return out;
}

}  // namespace qtrain
