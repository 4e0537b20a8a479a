// What a run tells its user: console lines in the seed's format ([T] per step, [V] per eval,
// [Allocator State], ...) and a JSON Lines file with one event per line (options, system, dataset,
// memory, step, eval, checkpoint, checkpoint_rejected, checkpoint_removed, resume, done) for scripts/plot_training_run.py and the W&B export.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "model/memory_plan.h"

namespace qtrain {

class DataLoader;
struct OptionChange;
struct TrainOptions;

class Logger {
public:
    // Opens (appends to, when `append`) the JSONL file; its directory is created.
    Logger(const std::string& jsonl_path, bool append);
    ~Logger();
    Logger(const Logger&) = delete;
    Logger& operator=(const Logger&) = delete;

    void log_options(const TrainOptions& options, const std::string& command_line);
    void log_system(const std::string& device, const std::string& description, double peak_flops);
    void log_model(const std::string& source, int64_t parameters, const std::string& config_json);
    void log_dataset(const char* split, const DataLoader& loader);
    void log_memory(const MemoryPlan& plan, uint64_t limit_bytes);
    void log_sol(double flops_per_token, double peak_flops);
    void log_step(int step, double epoch, int64_t tokens, double ms, float norm, float loss, float lr);
    void log_eval(int step, double epoch, int64_t tokens, double ms, float loss);
    void log_checkpoint(int step, const std::string& path, double ms);
    // `skipped`: newer checkpoints rejected (log_checkpoint_rejected); `verified`: false for a
    // checkpoint written before checksums, which is loaded unverified (with a note).
    void log_resume(int step, const std::string& path, int skipped = 0, bool verified = true);
    // print=false: the console line was printed already (the rejection was found before the log opened)
    void log_checkpoint_rejected(const std::string& path, const std::string& error, bool print = true);
    // A directory removed from --checkpoint-dir (a partial or, with --ckpt-keep, an old checkpoint);
    // with `error` set, one that could not be removed (a warning: training goes on).
    void log_checkpoint_removed(int step, const std::string& path, uint64_t bytes, const std::string& reason,
                                const std::string& error);
    // What --continue found different from the checkpoint's run (allowed, or forced by --force-resume).
    void log_option_changes(const std::vector<OptionChange>& changes);
    // A run stopped because a step was broken (non-finite, or a vanished gradient).
    void log_stopped(int step, const std::string& reason);
    // `written`: the file the export wrote into out_dir (model.safetensors, or a LoRA run's adapter_model.safetensors)
    void log_done(int step, const std::string& out_dir, double seconds,
                  const std::string& written = "model.safetensors");
    void message(const std::string& text);  // console only

    // Called with every JSONL line once it is written (the Python package's live callbacks, e.g. W&B).
    using Listener = std::function<void(const std::string& json_line)>;
    void set_listener(Listener listener) { listener_ = std::move(listener); }

    // FLOPs per trained token (set by log_sol; 0 = unknown): the "sol" column compares against it.
    double flops_per_token() const { return flops_per_token_; }

private:
    void write_line(const std::string& json_line);
    std::string path_;
    Listener listener_;
    FILE* file_ = nullptr;
    double flops_per_token_ = 0, peak_flops_ = 0;
    double train_loss_sum_ = 0;
    int train_loss_count_ = 0;
};

}  // namespace qtrain
