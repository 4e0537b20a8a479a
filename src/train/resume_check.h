// Whether `--continue` resumes the same run: the options a checkpoint recorded (TrainOptions::to_json
// of the run that wrote it, in state.json) against the new run's. Options that change the math or
// the data (model, batch, sequence length, accumulation, seed, dtypes, data files, schedule,
// optimizer) must be equal; the rest (paths, intervals, --steps, memory and speed settings) may
// change, and a changed --steps is explained because it reshapes the learning-rate schedule. Which
// flag is which is its ResumeRule in the option table (option_table.cpp).
#pragma once

#include <string>
#include <vector>

#include "model/model_config.h"

namespace qtrain {

struct TrainOptions;

struct OptionChange {
    std::string flag;           // "--batch-size", or "model config" for the model's shape
    std::string before, after;  // as recorded / as given now
    bool changes_run = false;   // true: refused unless --force-resume
    std::string note;           // what the change means (may be empty)
};

// `recorded_options_json` and `recorded_device` come from the checkpoint's state.json,
// `recorded_config_json` is its model config; `now`/`device`/`config` describe this run.
std::vector<OptionChange> compare_resume_options(const std::string& recorded_options_json,
                                                 const std::string& recorded_device,
                                                 const std::string& recorded_config_json, const TrainOptions& now,
                                                 const std::string& device, const ModelConfig& config);

// One line per change, for the console and the error message.
std::string describe_option_change(const OptionChange& change);

}  // namespace qtrain
