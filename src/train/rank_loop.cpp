#include "train/rank_loop.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"
#include "core/files.h"
#include "model/imodel.h"
#include "tokenizer/hf_tokenizer_export.h"
#include "train/checkpointer.h"
#include "train/data_loader.h"
#include "train/evaluation.h"
#include "train/logger.h"
#include "train/lr_schedule.h"
#include "train/model_dir_files.h"
#include "train/progress_watchdog.h"
#include "train/rank_devices.h"
#include "train/run_start.h"
#include "train/sol.h"
#include "train/step_agreement.h"

namespace qtrain {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One step's micro-batches on `model`: returns the targets that carry a loss.
// `progress` is called after each (the --comm-timeout watchdog's feed: the timeout bounds one
// micro-batch, not a whole step of many).
int64_t run_micro_batches(IModel& model, DataLoader& data, int accumulation, int batch_size, int seq_len,
                          float grad_scale, std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
                          ProgressWatchdog* progress) {
    int64_t valid = 0;
    for (int micro = 0; micro < accumulation; ++micro) {
        data.next_batch(inputs, targets);
        for (int32_t t : targets) valid += t >= 0;
        model.forward_backward(Batch{inputs.data(), targets.data(), batch_size, seq_len}, grad_scale);
        if (progress) progress->feed();
    }
    return valid;
}

class RankRun {
public:
    RankRun(const RunContext& ctx, comm::Communicator& host)
        : ctx_(ctx), o_(ctx.options), host_(host), rank_(host.rank()), world_(host.world()), lead_(rank_ == 0) {}

    int run() {
        try {
            start();
            return train();
        } catch (const std::exception& e) {
            // the model's communicator may be another world than the host's (the GPU backends): its
            // peers must not wait in a collective for this rank either
            if (model_comm_) model_comm_->abort(e.what());
            throw;
        }
    }

private:
    void start();
    int load_start_state();
    int train();
    int finish(int step);
    void evaluate(int step);
    void save_checkpoint(int completed_steps);
    [[noreturn]] void stop_at_broken_step(int step, const StepStats& stats, int64_t valid_targets);

    const RunContext& ctx_;
    const TrainOptions& o_;
    comm::Communicator& host_;
    const int rank_, world_;
    const bool lead_;                 // rank 0: decides the start, logs, exports
    std::unique_ptr<Logger> log_;     // rank 0's only
    RunStart start_;                  // rank 0's decision
    std::string resume_dir_;          // every rank's: the checkpoint rank 0 chose ("" = none)
    std::optional<CheckpointState> resume_state_;
    std::unique_ptr<DataLoader> train_data_, eval_data_;
    std::unique_ptr<comm::Communicator> model_comm_;  // declared before model_: outlives it
    std::unique_ptr<IModel> model_;
    LrSchedule schedule_;
    int start_step_ = 0;
    std::string last_checkpoint_;
    int last_checkpoint_step_ = 0;
    std::unique_ptr<ProgressWatchdog> watchdog_;  // --comm-timeout, with several ranks
};

void RankRun::start() {
    const ModelConfig& cfg = ctx_.source.config;
    double peak = 0;
    if (lead_) {
        // before the log is opened, so a fresh run truncates it
        start_ = decide_run_start(o_, ctx_.device, cfg, world_, ctx_.ranks_source);
        log_ = std::make_unique<Logger>(o_.log_path(), start_.append_log);
        for (const auto& [dir, error] : start_.rejected) log_->log_checkpoint_rejected(dir, error, /*print=*/false);
        log_->log_options(o_, ctx_.command_line);
        log_->log_system(ctx_.device, describe_device(ctx_.device, cfg, ctx_.model_options, &peak), peak);
        log_->log_model(ctx_.source.description, cfg.num_parameters(), model_config_to_json(cfg));
    }
    // The others learn which checkpoint rank 0 verified and chose (its state.json is small: each rank
    // reads it). They wait here while rank 0 verifies, so no rank allocates a model for a refused run.
    resume_dir_ = comm::broadcast_string(host_, lead_ && start_.resume ? start_.resume->dir : std::string());
    if (!resume_dir_.empty()) resume_state_ = lead_ ? start_.resume->state : read_checkpoint_state(resume_dir_);

    train_data_ = std::make_unique<DataLoader>(expand_glob(o_.train_file, "--train-file"), o_.batch_size, o_.seq_len,
                                               o_.seed, true, cfg.vocab_size, "--train-file");
    train_data_->set_rank(rank_, world_);
    if (!o_.eval_file.empty())
        eval_data_ = std::make_unique<DataLoader>(expand_glob(o_.eval_file, "--eval-file"), o_.batch_size, o_.seq_len,
                                                  o_.seed, false, cfg.vocab_size, "--eval-file");
    if (lead_) {
        log_->log_dataset("train", *train_data_);
        check_resume_train_files(start_, *train_data_, o_);
        if (eval_data_) log_->log_dataset("eval", *eval_data_);
        log_->log_memory(ctx_.plan.plan, ctx_.plan.limit);
    }

    // set-up phases are timed: for a 14B model with 110 GiB pinned they take minutes
    ModelOptions mopt = ctx_.model_options;
    mopt.device_index = rank_device_index(ctx_.gpu_ids, rank_, ctx_.mpi_local_rank);
    auto t_setup = Clock::now();
    model_ = create_model(cfg, mopt, ctx_.device);
    if (lead_) {
        log_->message(fmt::format("[Setup] model created and its memory allocated in {:.1f} s", seconds_since(t_setup)));
        // per-tensor work on a large model takes minutes: a line every 10 s or so, none for small models
        auto last_progress = std::make_shared<Clock::time_point>(Clock::now());
        Logger* log = log_.get();
        model_->set_progress([log, last_progress](const char* what, int64_t done, int64_t total) {
            if (done >= total || seconds_since(*last_progress) < 10.0) return;
            *last_progress = Clock::now();
            log->message(fmt::format("[Setup] {}: {:.0f}% ({:.2f}G of {:.2f}G parameters)", what, 100.0 * done / total,
                                     done / 1e9, total / 1e9));
        });
        log_->log_sol(training_flops_per_token(cfg, o_.seq_len), peak);
    }
    if (world_ > 1 && o_.comm_timeout > 0) {
        // A rank stuck in a step or an evaluation for --comm-timeout: a peer died or hangs. The stuck
        // thread cannot be woken (a GPU collective waits in a kernel), so the watchdog's thread
        // reports, aborts the communicators (peers waiting in a host collective then fail naming this
        // rank) and ends the process; every other rank's watchdog or communicator ends it there.
        const int rank = rank_;
        const double timeout = o_.comm_timeout;
        watchdog_ = std::make_unique<ProgressWatchdog>(
            std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000.0)),
            [this, rank, timeout](const std::string& what, double seconds) {
                const std::string why = fmt::format(
                    "rank {}: {} made no progress for {:.0f} s (--comm-timeout={}): a peer rank has died or hangs in a "
                    "collective (or this rank is stuck); stopping. Nothing after the last complete checkpoint is "
                    "kept; --continue resumes from it",
                    rank, what, seconds, timeout);
                std::fprintf(stderr, "\n[Error] %s\n", why.c_str());
                std::fflush(stderr);
                // the aborts may block on a wedged device or a dead peer: give them a moment, then go
                std::thread([this, why] {
                    host_.abort(why);
                    if (model_comm_) model_comm_->abort(why);
                }).detach();
                std::this_thread::sleep_for(std::chrono::seconds(2));
                std::_Exit(3);
            });
    }
    if (world_ > 1) {
        // the model's collectives go over its own communicator when its backend has one (model_factory.h)
        if (ctx_.model_communicator) model_comm_ = ctx_.model_communicator(host_, mopt.device_index);
        // --zero-level=3 or --shard-weights (train_options.cpp sets both flags below it too)
        const int zero_level = mopt.shard_weights ? 3 : mopt.shard_gradients ? 2 : 1;
        model_->set_communicator(model_comm_ ? model_comm_.get() : &host_, zero_level);
        if (lead_)
            log_->message(cat("[Setup] ", ctx_.launch, ": ", world_, ctx_.device == "cpu" ? " CPU" : " GPU",
                              " ranks, ZeRO-", zero_level, " (every rank trains, evaluates its share of the eval "
                              "batches and writes its part of each checkpoint; rank 0 logs and exports)"));
    }

    t_setup = Clock::now();
    start_step_ = load_start_state();
    if (lead_) {
        if (start_.resume) {
            log_->log_resume(start_step_, start_.resume->dir, start_.resume->skipped, start_.resume->verified);
            for (const OptionChange& c : start_.changes)
                log_->message(cat("[Resume] ", c.changes_run ? "--force-resume: " : "", describe_option_change(c)));
            log_->log_option_changes(start_.changes);
        }
        log_->message(fmt::format("[Setup] parameters {} in {:.1f} s",
                                  start_.resume ? "and optimizer state loaded" : o_.from_scratch ? "initialised" : "loaded",
                                  seconds_since(t_setup)));
    }
    schedule_.peak_lr = o_.learning_rate;
    schedule_.total_steps = o_.steps;
    schedule_.warmup_steps = o_.warmup_steps();
    schedule_.cooldown_steps = o_.cooldown;
    schedule_.final_lr_fraction = o_.final_lr_fraction;
    schedule_.decay = parse_lr_decay(o_.lr_schedule);
    last_checkpoint_ = resume_dir_;
    last_checkpoint_step_ = start_step_;
}

// The state the run starts from on this rank: the resume point's (weights, optimizer state, data
// position; every rank loads the same checkpoint directory), else a random init or the --model
// directory's weights. Returns the first step to run.
int RankRun::load_start_state() {
    if (resume_state_) {
        model_->load_checkpoint(resume_dir_);
        train_data_->set_state(resume_state_->train_data);
        return resume_state_->step;
    }
    if (lead_ && o_.continue_from_checkpoint)
        log_->message(fmt::format("[Resume] no checkpoint in '{}', starting from step 0", o_.checkpoint_dir));
    if (o_.from_scratch) {
        model_->init_random(o_.seed);
    } else {
        const ModelSource& source = ctx_.source;
        QT_CHECK(source.directory, "--model: no weights to load for ", source.description, " (add --from-scratch)");
        if (lead_) log_->message("Loading weights from " + *source.directory);
        model_->load_hf(*source.directory);
    }
    return 0;
}

int RankRun::train() {
    const float grad_scale = 1.0f / static_cast<float>(o_.grad_accumulation * world_);
    const int64_t step_tokens = static_cast<int64_t>(o_.batch_size) * o_.seq_len * o_.grad_accumulation * world_;
    std::vector<int32_t> inputs, targets;
    int step = start_step_;
    bool evaluated_last = false;
    for (; step < o_.steps; ++step) {
        WatchdogScope watched(watchdog_.get(), fmt::format("step {}", step));
        maybe_fail_for_test(ctx_.test_fault, rank_, step);
        const auto t0 = Clock::now();
        const int64_t valid = run_micro_batches(*model_, *train_data_, o_.grad_accumulation, o_.batch_size,
                                                o_.seq_len, grad_scale, inputs, targets, watchdog_.get());
        const float lr = schedule_.at(step);
        const StepStats stats = model_->optimizer_step(OptimizerParams{
            lr, o_.beta_1, o_.beta_2, o_.adam_epsilon, o_.weight_decay, o_.grad_clip, step + 1});
        // every rank decides alike: the global target count, and one stop for all on any rank's signal
        const StepAgreement agreed = agree_after_step(host_, ctx_.stop_signal->load() != 0, valid);
        if (lead_) {
            log_->log_step(step, train_data_->epoch_progress(), step_tokens, ms_since(t0), stats.grad_norm, stats.loss,
                           lr);
            if (std::string notes = model_->performance_notes(); !notes.empty()) log_->message(notes);
        }
        // the model applied no update (imodel.h); its stats are the same on every rank
        if (!IModel::update_allowed(stats)) {
            const bool finite = std::isfinite(stats.loss) && std::isfinite(stats.grad_norm);
            if (finite && agreed.valid_targets == 0) {
                if (lead_)
                    log_->message(fmt::format("note: step {} had no unmasked target (every loss position masked): "
                                              "nothing to learn, no update applied", step));
            } else {
                // Rank 0 reports the stop; the others end without an error of their own (under mpirun
                // a second failing process could end the job before rank 0's message is out).
                if (!lead_) return 0;
                stop_at_broken_step(step, stats, agreed.valid_targets);
            }
        }

        if (watchdog_) watchdog_->disarm();  // (the checkpoint below is not timed)
        const int completed = step + 1;
        evaluated_last = false;
        if (o_.eval_every_n_steps > 0 && completed % o_.eval_every_n_steps == 0) {
            evaluate(completed);
            evaluated_last = true;
        }
        const bool periodic = o_.ckpt_interval > 0 && completed % o_.ckpt_interval == 0;
        if (periodic) save_checkpoint(completed);
        if (agreed.stop) {
            if (lead_) {
                const int sig = ctx_.stop_signal->load();
                log_->message(sig ? fmt::format("\nStopping on signal {} after step {}", sig, step)
                                  : fmt::format("\nStopping after step {}: another rank received a stop signal", step));
            }
            if (!periodic && !o_.checkpoint_dir.empty()) save_checkpoint(completed);
            return 130;
        }
    }
    if (!evaluated_last) evaluate(step);
    return finish(step);
}

void RankRun::stop_at_broken_step(int step, const StepStats& stats, int64_t valid_targets) {
    const bool finite = std::isfinite(stats.loss) && std::isfinite(stats.grad_norm);
    const std::string what =
        finite ? cat("the gradient vanished (norm exactly 0 with ", valid_targets, " targets, loss ", stats.loss,
                     "): the activations have saturated, so the weights no longer affect the loss")
               : cat("the loss or the gradient norm is not finite (loss ", stats.loss, ", grad norm ", stats.grad_norm,
                     ")");
    log_->log_stopped(step, what);
    throw_error(cat("training stopped at step ", step, ": ", what,
                    ". The step's update was not applied and no checkpoint was written from it. ",
                    last_checkpoint_.empty()
                        ? std::string("There is no checkpoint of this run. ")
                        : cat("The last checkpoint is ", last_checkpoint_, " (after ", last_checkpoint_step_,
                              " steps); if the run was unstable before it, it may hold the damage already. "),
                    "Try a lower --learning-rate (now ", o_.learning_rate, ") or --grad-clip",
                    last_checkpoint_.empty() ? std::string(".")
                                             : std::string(", resuming with --continue --force-resume and the new "
                                                           "value, or from an earlier checkpoint.")));
}

void RankRun::evaluate(int step) {
    if (!eval_data_) return;
    const auto t0 = Clock::now();
    WatchdogScope watched(watchdog_.get(), fmt::format("the evaluation after step {}", step));
    const EvalResult r = evaluate_over_ranks(*model_, *eval_data_, o_.eval_num_steps, o_.batch_size, o_.seq_len, host_,
                                             [this] {
                                                 if (watchdog_) watchdog_->feed();
                                             });
    if (lead_) log_->log_eval(step, train_data_->epoch_progress(), r.tokens, ms_since(t0), r.loss);
}

void RankRun::save_checkpoint(int completed_steps) {
    const auto t0 = Clock::now();
    CheckpointState st;  // rank 0's is the one written
    st.step = completed_steps;
    if (lead_) {
        // what killed runs left in --checkpoint-dir goes before this run adds to it
        for (const RemovedDir& r : remove_partial_checkpoints(o_.checkpoint_dir))
            log_->log_checkpoint_removed(completed_steps, r.path, r.bytes, r.reason, r.error);
        st.train_data = train_data_->state();  // the same on every rank (DataLoader::set_rank)
        st.options_json = o_.to_json();
        st.config_json = model_config_to_json(ctx_.source.config);
        st.device = ctx_.device;
        for (const auto& file : train_data_->files()) st.train_files.emplace_back(file->path(), file->size());
    }
    const std::string dir = write_checkpoint(host_, o_.checkpoint_dir, *model_, st);
    last_checkpoint_ = dir;
    last_checkpoint_step_ = completed_steps;
    if (!lead_) return;
    log_->log_checkpoint(completed_steps, dir, ms_since(t0));
    for (const RemovedDir& r : prune_checkpoints(o_.checkpoint_dir, o_.ckpt_keep, dir))
        log_->log_checkpoint_removed(completed_steps, r.path, r.bytes, r.reason, r.error);
}

int RankRun::finish(int step) {
    // Rank 0 exports. The training is worth more than the export: when it fails, every rank keeps
    // the state in a checkpoint (collective) that the export can be redone from. With sharded
    // weights (ZeRO-3) save_hf is collective (imodel.h): every rank calls it, even when rank 0
    // could not create the directory, so that no rank waits for another in it; rank 0 writes.
    const auto t_export = Clock::now();
    const bool collective = model_->weights_sharded();
    std::string export_error;
    if (lead_ || collective) {
        std::string dir_error;
        if (lead_) {
            std::error_code ec;
            fs::create_directories(o_.out_dir, ec);
            if (ec) dir_error = cat("--out-dir: cannot create '", o_.out_dir, "': ", ec.message());
        }
        try {
            if (dir_error.empty() || collective) model_->save_hf(o_.out_dir);
        } catch (const std::exception& e) {
            export_error = e.what();
        }
        if (!dir_error.empty()) export_error = dir_error;  // the cause, not save_hf's failure after it
    }
    const double failed_here = export_error.empty() ? 0.0 : 1.0;
    double failed = 0.0;
    comm::sum_scalars_over_ranks(host_, &failed_here, &failed, 1);
    if (failed > 0.0) {
        std::string kept = last_checkpoint_step_ == step ? last_checkpoint_ : std::string();
        if (kept.empty()) {
            try {
                save_checkpoint(step);
                kept = last_checkpoint_;
            } catch (const std::exception& e2) {
                if (!lead_) throw;
                throw_error(cat("exporting the model to --out-dir '", o_.out_dir, "' failed: ", export_error,
                                "; saving a checkpoint instead failed too: ", e2.what()));
            }
        }
        if (!lead_) return 0;  // rank 0 reports it
        throw_error(cat("exporting the model to --out-dir '", o_.out_dir, "' failed: ", export_error,
                        "; the trained state is in ", kept,
                        ": fix the cause and run the same command with --continue to export it"));
    }
    if (!lead_) return 0;
    log_->message(fmt::format("[Setup] model exported in {:.1f} s", seconds_since(t_export)));
    const std::optional<Tokenizer>& tokenizer = *ctx_.tokenizer;
    if (ctx_.source.directory) copy_model_dir_files(*ctx_.source.directory, o_.out_dir, !tokenizer);
    if (tokenizer) {
        const std::vector<std::string> files = export_hf_tokenizer(*tokenizer, o_.out_dir);
        std::string names;
        for (const std::string& f : files) names += (names.empty() ? "" : ", ") + f;
        log_->message(cat("[Setup] tokenizer files written: ", names, " (from ", tokenizer->source(), ")"));
    }
    log_->log_done(step, o_.out_dir, seconds_since(ctx_.t_start));
    return 0;
}

}  // namespace

int run_rank(const RunContext& ctx, comm::Communicator& host) { return RankRun(ctx, host).run(); }

}  // namespace qtrain
