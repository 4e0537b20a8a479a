// `train --export-checkpoint=DIR --out-dir=OUT`: the HF model (model.safetensors, config.json) of a
// checkpoint, written without training (issue 19): after a run that died before its export, or to
// look at an earlier step. Any checkpoint: named tensors (the CPU model, one GPU) or the blocks of a
// GPU run on any number of ranks (io/flat_state_reader.h). The checkpoint's files are verified against
// their checksums first. A LoRA run's checkpoint gives its PEFT adapter, or with --merge-lora the
// merged model of the base --model names.
#pragma once

#include "train/checkpointer.h"
#include "train/train_options.h"

namespace qtrain {

// Returns 0 after writing --out-dir; throws naming the checkpoint, the file or the flag otherwise.
int export_checkpoint(const TrainOptions& options);

// The checkpoint of a LoRA run (lora_checkpoint_export.cpp): its PEFT adapter, or with --merge-lora
// --model's base with the adapters merged in (config.json and tokenizer files beside it). `st` is its
// state.json, `verified` whether its checksums were checked.
int export_lora_checkpoint(const TrainOptions& options, const CheckpointState& st, bool verified);

}  // namespace qtrain
