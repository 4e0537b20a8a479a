#include "train/run_start.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "io/flat_state_reader.h"
#include "model/checkpoint_layout.h"
#include "model/lora.h"
#include "train/data_loader.h"
#include "train/run_guard.h"
#include "train/train_options.h"

namespace qtrain {

namespace fs = std::filesystem;

namespace {

// The newest checkpoint that verifies: a corrupt one (or one whose state.json does not read) is
// reported and the one before it tried; none left is an error, never a silent step 0. Hashing a large
// checkpoint takes minutes (a 7B one is ~100 GB), so it says what is going on.
ResumePoint find_checkpoint_to_resume(const TrainOptions& o, RunStart& start) {
    std::printf("[Resume] checking the checkpoints in '%s' (newest first)\n", o.checkpoint_dir.c_str());
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    ResumePoint r = find_resume_point(o.checkpoint_dir, [&](const std::string& dir, const std::string& error) {
        std::printf("[Resume] cannot resume from %s: %s\n", dir.c_str(), error.c_str());
        std::fflush(stdout);
        start.rejected.emplace_back(dir, error);
    });
    if (r.verified)
        std::printf("[Resume] %s: every file matches its checksum (%.1f s)\n", r.dir.c_str(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return r;
}

// A --continue without a checkpoint: a typo in --checkpoint-dir must not start over and replace the
// run it meant to resume. Returns whether the log is this run's own (then appended to).
bool check_fresh_continue(const TrainOptions& o, const std::string& device, const ModelConfig& cfg) {
    std::vector<std::string> existing = existing_run_output(o);
    std::error_code ec;
    bool own_log = false;
    if (fs::is_regular_file(o.log_path(), ec) && fs::file_size(o.log_path(), ec) > 0 &&
        log_is_of_this_run(o.log_path(), o, device, cfg)) {
        own_log = true;  // this run's own log: it restarts before its first checkpoint
        if (!existing.empty() && existing.front() == o.log_path()) existing.erase(existing.begin());
        if (existing.empty())
            std::printf("[Resume] no checkpoint in '%s' yet: this run starts from step 0, appending to its log %s\n",
                        o.checkpoint_dir.c_str(), o.log_path().c_str());
    }
    std::string list;
    for (const auto& path : existing) list += (list.empty() ? "'" : ", '") + path + "'";
    QT_CHECK(existing.empty() || o.overwrite, "--continue: no complete checkpoint in --checkpoint-dir '",
             o.checkpoint_dir, "', but ", list, " hold", existing.size() == 1 ? "s" : "",
             own_log ? " the output of this same run, which finished without writing a checkpoint to resume from"
                       " (--ckpt-interval); starting from step 0 would replace it"
                     : " another run's output, which starting from step 0 would replace",
             ". Check --checkpoint-dir, or add --overwrite to start from step 0 anyway");
    return own_log;
}

// A fresh run (no --continue) into an --out-dir / --log-file that holds another run's model or log
// (the default output/ is the easiest way to lose one) is refused before any work, unless --overwrite.
void check_fresh_output(const TrainOptions& o) {
    const std::vector<std::string> existing = existing_run_output(o);
    if (existing.empty()) return;
    std::string list;
    for (const auto& path : existing)
        list += cat(list.empty() ? "'" : ", '", path, path == o.log_path() ? "' (the log, --log-file)" : "' (the model, --out-dir)");
    QT_CHECK(o.overwrite, "this fresh run would replace the output of an earlier run: ", list,
             ". Choose another --out-dir", o.log_file.empty() ? "" : " / --log-file",
             ", add --continue to resume that run from its checkpoints, or add --overwrite to replace ",
             existing.size() == 1 ? "it" : "them");
    std::printf("[Setup] --overwrite: replacing %s\n", list.c_str());
}

}  // namespace

void check_resume_point(RunStart& start, const TrainOptions& o, const std::string& device, const ModelConfig& cfg,
                        int world, const std::string& ranks_source, const std::string& what) {
    const ResumePoint& r = *start.resume;
    start.changes = compare_resume_options(r.state.options_json, r.state.device, r.state.config_json, o, device, cfg);
    std::string refused;
    for (const OptionChange& c : start.changes)
        if (c.changes_run) refused += "\n  " + describe_option_change(c);
    QT_CHECK(refused.empty() || o.force_resume, what, ": this run differs from the one that wrote ", r.dir,
             " in options that change the math or the data:", refused,
             "\nGive the checkpoint's values to resume it, a new --checkpoint-dir to start another run, or "
             "--force-resume to resume with these changes anyway");
    // Any number of ranks reads any checkpoint: a GPU-model rank reads its block of the flat space
    // from whatever the checkpoint holds (the blocks of any world size, or named tensors), the CPU
    // model the whole state (io/flat_state_reader.h: resharding on load). Opened here, before any
    // model exists, so one that cannot be read (blocks missing or of two world sizes, another
    // model's) is refused now. (Whether the run stays the same run at another world size,
    // accumulation x ranks, was compare_resume_options' question, above.)
    if (o.lora_rank > 0) {
        // a LoRA run's checkpoint holds the adapters and their moments only (model/lora.h), no flat state
        QT_CHECK(fs::exists(fs::path(r.dir) / kAdapterWeightsFile), what, ": ", r.dir, " holds no ",
                 kAdapterWeightsFile, ": it is not a checkpoint of a LoRA run (--lora-rank=", o.lora_rank, ")");
        return;
    }
    std::optional<FlatStateReader> readable;
    try {
        readable.emplace(r.dir, gpu_checkpoint_layout(cfg));
    } catch (const Error& e) {
        throw_error(cat(what, ": ", r.dir, " cannot be loaded: ", e.what()));
    }
    if (r.state.world_size != world)
        std::printf("[Resume] %s was written by %d rank%s, this run has %d (%s): each rank reads its part of "
                    "the state from the checkpoint's %s (resharding)\n",
                    r.dir.c_str(), r.state.world_size, r.state.world_size == 1 ? "" : "s", world,
                    ranks_source.c_str(), readable->describe().c_str());
}

RunStart decide_run_start(const TrainOptions& o, const std::string& device, const ModelConfig& cfg, int world,
                          const std::string& ranks_source) {
    RunStart start;
    const std::vector<std::string> checkpoints = list_checkpoint_dirs(o.checkpoint_dir);
    if (o.continue_from_checkpoint && !checkpoints.empty()) {
        start.resume = find_checkpoint_to_resume(o, start);
        check_resume_point(start, o, device, cfg, world, ranks_source);
        start.append_log = true;
    } else if (o.continue_from_checkpoint) {
        start.append_log = check_fresh_continue(o, device, cfg);
    } else {
        // A fresh run. Its checkpoints would mix with another run's (and --continue would pick the
        // newest), and its model and log would replace that run's: both refused unless --overwrite.
        if (!checkpoints.empty()) {
            QT_CHECK(o.overwrite, "--checkpoint-dir '", o.checkpoint_dir, "' holds checkpoints of another run (newest: ",
                     checkpoints.front(), "): add --continue to resume it, choose another --checkpoint-dir, or add "
                     "--overwrite to remove them and start from step 0");
            for (const auto& dir : checkpoints) fs::remove_all(dir);
            std::printf("[Setup] --overwrite: removed the checkpoints in '%s'\n", o.checkpoint_dir.c_str());
        }
        check_fresh_output(o);
    }
    return start;
}

void check_resume_train_files(RunStart& start, const DataLoader& train_data, const TrainOptions& o) {
    if (!start.resume || start.resume->state.train_files.empty()) return;
    // other files (a shard added under the same glob, a re-tokenised file) make another run
    std::vector<std::pair<std::string, int64_t>> now;
    for (const auto& file : train_data.files()) now.emplace_back(file->path(), file->size());
    const auto& recorded = start.resume->state.train_files;
    if (now == recorded) return;
    auto list = [](const std::vector<std::pair<std::string, int64_t>>& files) {
        std::string out;
        for (std::size_t i = 0; i < files.size() && i < 4; ++i)
            out += cat(i ? ", " : "", files[i].first, " (", files[i].second, " tokens)");
        return files.size() > 4 ? cat(out, ", ... (", files.size(), " files)") : out;
    };
    const std::string what = cat("--train-file: the checkpoint's run trained on ", list(recorded),
                                 "; this run's files are ", list(now));
    QT_CHECK(o.force_resume, "--continue: this run differs from the one that wrote ", start.resume->dir,
             " in its data:\n  ", what, "\nThe data order would differ; resume with the same files, or add "
             "--force-resume to resume on these anyway");
    start.changes.push_back({"--train-file (files)", list(recorded), list(now), true, ""});
}

}  // namespace qtrain
