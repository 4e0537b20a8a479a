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
    return d;
}

Packing loader_packing(const PackingDecision& d, int eos_token_id) {
    Packing p;
    p.enabled = d.document_masking;
    p.eos_token_id = eos_token_id;
    return p;
}

}  // namespace qtrain
