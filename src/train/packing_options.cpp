#include "train/packing_options.h"

#include "io/token_file.h"

namespace qtrain {

PackingDecision decide_packing(const TrainOptions& o, const std::vector<std::string>& train_files) {
    PackingDecision d;
    if (o.document_masking == "on") {
        d.document_masking = true;
    } else if (o.document_masking == "auto" && !train_files.empty()) {
        // the header is all that is read (the file is mapped, not loaded)
        d.document_masking = true;
        for (const std::string& f : train_files) d.document_masking = d.document_masking && TokenFile(f).has_document_starts();
    }
    d.token_normalization = o.loss_normalization == "tokens" || (o.loss_normalization == "auto" && d.document_masking);
    d.one_per_row = o.packing == "one-per-row";
    return d;
}

Packing loader_packing(const PackingDecision& d, int eos_token_id) {
    Packing p;
    p.enabled = d.document_masking;
    p.eos_token_id = eos_token_id;
    p.one_per_row = d.one_per_row;
    return p;
}

void positions_after_eos(const int32_t* inputs, int64_t rows, int seq_len, int eos_token_id, int32_t* positions) {
    for (int64_t r = 0; r < rows; ++r) {
        const int32_t* in = inputs + r * seq_len;
        int32_t* pos = positions + r * seq_len;
        for (int t = 0; t < seq_len; ++t) pos[t] = t > 0 && in[t - 1] != eos_token_id ? pos[t - 1] + 1 : 0;
    }
}

}  // namespace qtrain
