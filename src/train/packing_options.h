// What --document-masking and --loss-normalization mean for a run, resolved where the train files are
// opened (their headers say whether they record document starts), so the model, the loaders and the
// step see one decision (docs/design.md, "Data").
#pragma once

#include <string>
#include <vector>

#include "train/data_loader.h"
#include "train/train_options.h"

namespace qtrain {

struct PackingDecision {
    bool document_masking = false;     // pack documents into rows, Batch::positions given
    bool token_normalization = false;  // Batch::loss_denominator = the step's trained tokens
    bool one_per_row = false;          // --packing=one-per-row: one document per row, padded
};

// --document-masking: on, off, or auto = on when there are train files and every one records document
// starts; --loss-normalization: tokens, micro-batch, or auto = tokens with document masking.
// `train_files`: --train-file's expansion (empty: no --train-file, the Python session's own tokens).
PackingDecision decide_packing(const TrainOptions& o, const std::vector<std::string>& train_files);

// The loaders' packing for the decision (documents end after the model's EOS where a file has no
// document starts).
Packing loader_packing(const PackingDecision& d, int eos_token_id);

// Positions (Batch::positions) for rows given without them (the Python session's own tokens under
// --document-masking=on): each row's documents end after each `eos_token_id` input, as the loader's
// rule for files without document starts.
void positions_after_eos(const int32_t* inputs, int64_t rows, int seq_len, int eos_token_id, int32_t* positions);

}  // namespace qtrain
