#include "tokenizer/batch_encoder.h"

#include <atomic>
#include <exception>
#include <mutex>
#include <string_view>
#include <thread>

namespace qtrain {
namespace {

struct WorkItem {
    std::size_t doc;
    int part;  // 0: the text (or prompt), 1: the response
    std::string_view text;
};

}  // namespace

std::vector<EncodedDocument> encode_batch(const Tokenizer& tokenizer, const std::vector<Document>& docs,
                                          bool with_masks, const BatchEncodeOptions& options,
                                          EncodeStats* stats) {
    std::vector<WorkItem> items;
    for (std::size_t d = 0; d < docs.size(); ++d) {
        for (const std::string_view chunk : tokenizer.split_for_parallel(docs[d].text, options.chunk_bytes)) {
            items.push_back({d, 0, chunk});
        }
        if (with_masks) items.push_back({d, 1, docs[d].response});
    }
    std::vector<std::vector<int32_t>> results(items.size());
    std::atomic<std::size_t> next{0};
    std::atomic<std::size_t> invalid{0};
    std::exception_ptr error;
    std::mutex error_mutex;
    auto worker = [&] {
        EncodeStats local;
        try {
            for (std::size_t i; (i = next.fetch_add(1)) < items.size();) {
                tokenizer.encode(items[i].text, results[i], options.special, &local);
            }
        } catch (...) {
            std::lock_guard<std::mutex> lock(error_mutex);
            if (!error) error = std::current_exception();
            next = items.size();
        }
        invalid += local.invalid_utf8;
    };
    const int threads = std::max(1, std::min<int>(options.threads, static_cast<int>(items.size())));
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
    for (std::thread& t : pool) t.join();
    if (error) std::rethrow_exception(error);
    if (stats) stats->invalid_utf8 += invalid;

    std::vector<EncodedDocument> out(docs.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
        EncodedDocument& e = out[items[i].doc];
        e.tokens.insert(e.tokens.end(), results[i].begin(), results[i].end());
        if (with_masks) e.mask.resize(e.tokens.size(), static_cast<uint8_t>(items[i].part));
    }
    if (options.eos_id >= 0) {
        for (EncodedDocument& e : out) {
            e.tokens.push_back(options.eos_id);
            if (with_masks) e.mask.push_back(1);
        }
    }
    return out;
}

}  // namespace qtrain
