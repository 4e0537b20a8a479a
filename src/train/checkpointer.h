// Checkpoints: <checkpoint-dir>/step_XXXXXXXX/ holding the model's files (master weights, optimizer
// state) and state.json (step, data position, world size, options, and the size and XXH3-64
// checksum of every file the model wrote). Written into a temporary directory
// `.tmp_step_XXXXXXXX_<pid>` that is renamed into place only when complete, so a crash never leaves a
// half checkpoint; state.json is the last file written, and a directory without it is never taken
// for a checkpoint. The checksums catch what the rename cannot: a file damaged or truncated after it
// was written.
//
// Under data parallel the write is collective: every rank writes its own part of the model's state
// into rank 0's temporary directory, and only when every rank's part is there does rank 0 hash all
// the files (the other ranks' too), write state.json and rename. A checkpoint is complete only when
// every rank's part is. When the ranks wrote blocks of the flat space (the GPU model at N > 1), rank 0
// also records them in state.json as "shards" (each file's rank and range, the arrays' dtypes), read
// back from the blocks' metadata: the checkpoint's manifest, with the world size, options (ZeRO level,
// dtypes), data-loader state and checksums beside it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "train/data_loader.h"

namespace qtrain {

namespace comm {
class Communicator;
}
class IModel;

struct CheckpointState {
    int step = 0;                 // optimizer steps completed
    DataLoaderState train_data;
    std::string options_json;     // TrainOptions::to_json() of the run that wrote it
    std::string config_json;      // the model's config.json
    std::string device;
    // Ranks that wrote it (data parallel; 1 in checkpoints written before it was recorded). The GPU
    // model's ranks each write their block of the flat space, which state.json's "shards" describes
    // (io/block_set.h); any world size reads them back (io/flat_state_reader.h).
    int world_size = 1;
    // The training files as the data loader saw them (path, tokens): --continue checks the data is
    // the same, not only the --train-file glob. Empty in checkpoints written before it was recorded.
    std::vector<std::pair<std::string, int64_t>> train_files;
};

std::string checkpoint_step_dir(const std::string& root, int step);
// The complete checkpoints (step_XXXXXXXX directories with a state.json) under `root`, newest
// (highest step) first; empty when there are none or `root` does not exist.
std::vector<std::string> list_complete_checkpoints(const std::string& root);
// The complete checkpoint with the highest step under `root`, if any.
std::optional<std::string> find_latest_checkpoint(const std::string& root);
// Every step_XXXXXXXX directory under `root`, complete or not (a state.json deleted by hand), newest
// first: what --continue looks at, so that an incomplete newer one is reported, never silently passed.
std::vector<std::string> list_checkpoint_dirs(const std::string& root);

// Writes model state + state.json (with the checksums of the model's files) atomically; returns
// the final directory. Collective over `ranks` (every rank calls it with its own model, the same
// root and step): rank 0 makes the temporary directory and tells the others; barrier; every rank's
// model.save_checkpoint(tmp); barrier; rank 0 writes state.json (world_size = ranks.world(),
// `state` as rank 0 passed it) and renames; barrier, so it returns on every rank once the checkpoint
// is complete. A failure on any rank throws (the other ranks then fail in their next collective) and
// rank 0 removes the temporary directory.
std::string write_checkpoint(comm::Communicator& ranks, const std::string& root, const IModel& model,
                             const CheckpointState& state);
// The same for a single rank (world size 1).
std::string write_checkpoint(const std::string& root, const IModel& model, const CheckpointState& state);
// Reads state.json of a checkpoint directory (the model loads its own files).
CheckpointState read_checkpoint_state(const std::string& dir);

// Checks every file that state.json lists against its recorded size and checksum (sizes of all
// first: a truncated file is found without hashing the others); throws an Error naming the first
// file that is missing, truncated or corrupt. Returns false, having checked nothing, for a
// checkpoint written before qtrain recorded checksums.
bool verify_checkpoint(const std::string& dir);

// Where --continue resumes: the newest checkpoint directory (list_checkpoint_dirs) that has a
// state.json, verifies and whose state.json reads. Each newer one that does not (state.json missing
// included) is passed to `rejected(dir, error)` (as it is found: verifying a large checkpoint takes
// minutes) and skipped. Throws when none is left.
struct ResumePoint {
    std::string dir;
    CheckpointState state;
    bool verified = false;  // false: written before checksums, loaded unverified
    int skipped = 0;        // newer checkpoint directories rejected
};
ResumePoint find_resume_point(const std::string& root,
                              const std::function<void(const std::string& dir, const std::string& error)>& rejected);

// A directory that cleaning up removed (or, when `error` is set, failed to remove).
struct RemovedDir {
    std::string path;
    uint64_t bytes = 0;
    std::string reason;
    std::string error;
};
// Removes the partial checkpoints `.tmp_step_XXXXXXXX_<pid>` that killed runs left under `root`:
// only directories of exactly that name whose process is gone. Assumes the runs writing to
// `root` share this host (a pid is looked up here: a run on another host sharing the directory
// over a network file system could lose the checkpoint it is writing). This process's own pid
// counts as gone: it has no checkpoint in flight when it calls this, so such a directory is a
// dead run's whose pid was reused (containers restart with the same pids).
std::vector<RemovedDir> remove_partial_checkpoints(const std::string& root);
// Keeps the newest `keep` complete checkpoints under `root` (0 = all) and removes the older ones;
// never `just_written`, nor anything that is not a step_XXXXXXXX directory. A checkpoint is first
// renamed to a partial name, so a crash half-way through the removal leaves no half checkpoint,
// only a partial one that the next run removes.
std::vector<RemovedDir> prune_checkpoints(const std::string& root, int keep, const std::string& just_written);

}  // namespace qtrain
