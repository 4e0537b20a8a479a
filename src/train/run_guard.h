// Checks that keep a run from losing work before it spends any: output paths that could not be
// written at the end, and another run's output or log that a fresh start would replace.
#pragma once

#include <string>
#include <vector>

#include "model/model_config.h"

namespace qtrain {

struct TrainOptions;

// Fails now, naming `flag`, when `dir` could not be created or written later: the nearest existing
// ancestor must be a directory in which a file can be made. Nothing is created (a run that never
// checkpoints leaves no empty --checkpoint-dir behind); the probe file is removed at once.
void probe_writable_dir(const std::string& dir, const char* flag);
// The files of a finished or running run in --out-dir / --log-file that a fresh start would replace:
// a model.safetensors, and a log that records training (a step, an evaluation, the end), not one
// that stops at its set-up lines.
std::vector<std::string> existing_run_output(const TrainOptions& o);
// Whether the JSONL log at `path` was written by this same run (its options event matches in every
// option that changes the run, and the checkpoint directory is the same): a job restarted with
// --continue before its first checkpoint starts over in its own log, which is appended to.
bool log_is_of_this_run(const std::string& path, const TrainOptions& o, const std::string& device,
                        const ModelConfig& cfg);

}  // namespace qtrain
