// Checkpoints: <checkpoint-dir>/step_XXXXXXXX/ holding the model's files (master weights, optimizer
// state) and state.json (step, data position, options). Written into a temporary directory that is
// renamed into place only when complete, so a crash never leaves a half checkpoint; state.json is
// the last file written, and a directory without it is never taken for a checkpoint.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "train/data_loader.h"

namespace qtrain {

class IModel;

struct CheckpointState {
    int step = 0;                 // optimizer steps completed
    DataLoaderState train_data;
    std::string options_json;     // TrainOptions::to_json() of the run that wrote it
    std::string config_json;      // the model's config.json
    std::string device;
};

std::string checkpoint_step_dir(const std::string& root, int step);
// The complete checkpoint with the highest step under `root`, if any.
std::optional<std::string> find_latest_checkpoint(const std::string& root);
// Every complete checkpoint under `root`, newest first.
std::vector<std::string> list_complete_checkpoints(const std::string& root);

// Writes model state + state.json atomically; returns the final directory.
std::string write_checkpoint(const std::string& root, const IModel& model, const CheckpointState& state);
// Reads state.json of a checkpoint directory (the model loads its own files).
CheckpointState read_checkpoint_state(const std::string& dir);

}  // namespace qtrain
