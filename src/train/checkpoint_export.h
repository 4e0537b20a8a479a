// `train --export-checkpoint=DIR --out-dir=OUT`: the HF model (model.safetensors, config.json) of a
// checkpoint, written without training (issue 19): after a run that died before its export, or to
// look at an earlier step. Any checkpoint: named tensors (the CPU model, one GPU) or the blocks of a
// GPU run on any number of ranks (io/flat_state_reader.h). The checkpoint's files are verified against
// their checksums first.
#pragma once

#include "train/train_options.h"

namespace qtrain {

// Returns 0 after writing --out-dir; throws naming the checkpoint, the file or the flag otherwise.
int export_checkpoint(const TrainOptions& options);

}  // namespace qtrain
