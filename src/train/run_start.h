// How a run begins, decided by rank 0 before any model exists (docs/design.md, "Trust"): which
// checkpoint --continue resumes from, after verifying the newest ones; that this run can read it (at
// any number of ranks: io/flat_state_reader.h); that its run is this one (options, model config, and once the data is open,
// the training files); and, without a checkpoint, that no other run's output or checkpoints would be
// replaced (--overwrite removes them).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/model_config.h"
#include "train/checkpointer.h"
#include "train/resume_check.h"

namespace qtrain {

class DataLoader;
struct TrainOptions;

struct RunStart {
    std::optional<ResumePoint> resume;
    // newer checkpoints that failed verification: (directory, why), for the log once it is open
    std::vector<std::pair<std::string, std::string>> rejected;
    std::vector<OptionChange> changes;  // what differs from the checkpoint's run (allowed or forced)
    bool append_log = false;            // resume, or --continue of this run before its first checkpoint
};

// Prints what it checks on the console ([Resume] lines); throws a qtrain::Error for every refusal.
// `world` ranks, given by `ranks_source` ("--gpus=2", "mpirun -np 2") for the messages.
RunStart decide_run_start(const TrainOptions& o, const std::string& device, const ModelConfig& cfg, int world,
                          const std::string& ranks_source);

// The checks of a chosen start.resume (found by --continue, or named by the Python session's
// load_checkpoint): its options and model config against this run's (refused when they change the run,
// unless --force-resume; start.changes lists them), and that this run's ranks can read it.
void check_resume_point(RunStart& start, const TrainOptions& o, const std::string& device, const ModelConfig& cfg,
                        int world, const std::string& ranks_source, const std::string& what = "--continue");

// The training files must be the checkpoint's (the data order is a function of their chunks), unless
// --force-resume, which records the difference in start.changes.
void check_resume_train_files(RunStart& start, const DataLoader& train_data, const TrainOptions& o);

}  // namespace qtrain
