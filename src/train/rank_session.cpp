#include "train/rank_session.h"

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
#include "model/lora.h"
#include "tokenizer/hf_tokenizer_export.h"
#include "train/checkpointer.h"
#include "train/data_loader.h"
#include "train/logger.h"
#include "train/lr_schedule.h"
#include "train/model_dir_files.h"
#include "train/packing_options.h"
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

}  // namespace

struct RankSession::State {
    std::unique_ptr<Logger> log;  // rank 0's only
    RunStart start;               // rank 0's decision
    std::string resume_dir;       // every rank's: the checkpoint rank 0 chose ("" = none)
    std::optional<CheckpointState> resume_state;
    std::unique_ptr<DataLoader> train_data, eval_data;
    std::unique_ptr<comm::Communicator> model_comm;  // declared before model: outlives it
    std::unique_ptr<IModel> model;
    LrSchedule schedule;
    std::string last_checkpoint;
    int last_checkpoint_step = 0;
    std::unique_ptr<ProgressWatchdog> watchdog;  // --comm-timeout, with several ranks
    std::vector<int32_t> inputs, targets;        // one micro-batch
    std::vector<int32_t> positions;              // its document positions (document masking)
    PackingDecision packing;                     // --document-masking, --loss-normalization resolved
};

RankSession::RankSession(const RunContext& ctx, comm::Communicator& host)
    : ctx_(ctx), o_(ctx.options), host_(host), rank_(host.rank()), world_(host.world()), lead_(rank_ == 0),
      s_(std::make_unique<State>()) {
    try {
        start();
    } catch (const std::exception& e) {
        abort(e.what());
        throw;
    }
}

RankSession::~RankSession() = default;

void RankSession::abort(const std::string& why) {
    // the model's communicator may be another world than the host's (the GPU backends): its peers
    // must not wait in a collective for this rank either
    if (s_->model_comm) s_->model_comm->abort(why);
}

void RankSession::start() {
    State& s = *s_;
    const ModelConfig& cfg = ctx_.source.config;
    double peak = 0;
    if (lead_) {
        // before the log is opened, so a fresh run truncates it
        s.start = decide_run_start(o_, ctx_.device, cfg, world_, ctx_.ranks_source);
        s.log = std::make_unique<Logger>(o_.log_path(), s.start.append_log);
        if (ctx_.log_listener) s.log->set_listener(ctx_.log_listener);
        for (const auto& [dir, error] : s.start.rejected) s.log->log_checkpoint_rejected(dir, error, /*print=*/false);
        s.log->log_options(o_, ctx_.command_line);
        s.log->log_system(ctx_.device, describe_device(ctx_.device, cfg, ctx_.model_options, &peak), peak);
        s.log->log_model(ctx_.source.description, cfg.num_parameters(), model_config_to_json(cfg));
    }
    // The others learn which checkpoint rank 0 verified and chose (its state.json is small: each rank
    // reads it). They wait here while rank 0 verifies, so no rank allocates a model for a refused run.
    s.resume_dir = comm::broadcast_string(host_, lead_ && s.start.resume ? s.start.resume->dir : std::string());
    if (!s.resume_dir.empty()) s.resume_state = lead_ ? s.start.resume->state : read_checkpoint_state(s.resume_dir);

    // Without --train-file (the Python session feeding its own tokens) there is no loader.
    const std::vector<std::string> train_files =
        o_.train_file.empty() ? std::vector<std::string>() : expand_glob(o_.train_file, "--train-file");
    s.packing = ctx_.packing;  // decided once for the run (run_context.cpp)
    const Packing packing = loader_packing(s.packing, cfg.eos_token_id);
    if (!train_files.empty()) {
        s.train_data = std::make_unique<DataLoader>(train_files, o_.batch_size, o_.seq_len, o_.seed, true,
                                                    cfg.vocab_size, "--train-file", packing);
        s.train_data->set_rank(rank_, world_);
    }
    if (!o_.eval_file.empty())
        s.eval_data = std::make_unique<DataLoader>(expand_glob(o_.eval_file, "--eval-file"), o_.batch_size, o_.seq_len,
                                                   o_.seed, false, cfg.vocab_size, "--eval-file", packing);
    if (lead_) {
        if (s.train_data) {
            s.log->log_dataset("train", *s.train_data);
            check_resume_train_files(s.start, *s.train_data, o_);
        }
        if (s.eval_data) s.log->log_dataset("eval", *s.eval_data);
        log_packing();
        s.log->log_memory(ctx_.plan.plan, ctx_.plan.limit);
    }

    // set-up phases are timed: for a 14B model with 110 GiB pinned they take minutes
    ModelOptions mopt = ctx_.model_options;  // document_masking as ctx_.packing decided it
    mopt.device_index = rank_device_index(ctx_.gpu_ids, rank_, ctx_.mpi_local_rank);
    auto t_setup = Clock::now();
    s.model = create_model(cfg, mopt, ctx_.device);
    if (lead_) {
        s.log->message(fmt::format("[Setup] model created and its memory allocated in {:.1f} s", seconds_since(t_setup)));
        // per-tensor work on a large model takes minutes: a line every 10 s or so, none for small models
        auto last_progress = std::make_shared<Clock::time_point>(Clock::now());
        Logger* log = s.log.get();
        s.model->set_progress([log, last_progress](const char* what, int64_t done, int64_t total) {
            if (done >= total || seconds_since(*last_progress) < 10.0) return;
            *last_progress = Clock::now();
            log->message(fmt::format("[Setup] {}: {:.0f}% ({:.2f}G of {:.2f}G parameters)", what, 100.0 * done / total,
                                     done / 1e9, total / 1e9));
        });
        s.log->log_sol(training_flops_per_token(cfg, o_.seq_len), peak);
    }
    if (world_ > 1 && o_.comm_timeout > 0) {
        // A rank stuck in a step or an evaluation for --comm-timeout: a peer died or hangs. The stuck
        // thread cannot be woken (a GPU collective waits in a kernel), so the watchdog's thread
        // reports, aborts the communicators (peers waiting in a host collective then fail naming this
        // rank) and ends the process; every other rank's watchdog or communicator ends it there.
        const int rank = rank_;
        const double timeout = o_.comm_timeout;
        s.watchdog = std::make_unique<ProgressWatchdog>(
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
                    abort(why);
                }).detach();
                std::this_thread::sleep_for(std::chrono::seconds(2));
                std::_Exit(3);
            });
    }
    if (world_ > 1) {
        // the model's collectives go over its own communicator when its backend has one (backends/model_backends.h)
        if (ctx_.model_communicator) s.model_comm = ctx_.model_communicator(host_, mopt.device_index);
        const int zero = static_cast<int>(zero_level(mopt));
        s.model->set_communicator(s.model_comm ? s.model_comm.get() : &host_, zero);
        if (lead_)
            s.log->message(cat("[Setup] ", ctx_.launch, ": ", world_, ctx_.device == "cpu" ? " CPU" : " GPU",
                               " ranks, ZeRO-", zero, " (every rank trains, evaluates its share of the eval "
                               "batches and writes its part of each checkpoint; rank 0 logs and exports)"));
    }

    t_setup = Clock::now();
    step_ = load_start_state();
    if (lead_) {
        if (s.start.resume) {
            s.log->log_resume(step_, s.start.resume->dir, s.start.resume->skipped, s.start.resume->verified);
            for (const OptionChange& c : s.start.changes)
                s.log->message(cat("[Resume] ", c.changes_run ? "--force-resume: " : "", describe_option_change(c)));
            s.log->log_option_changes(s.start.changes);
        }
        s.log->message(fmt::format("[Setup] parameters {} in {:.1f} s",
                                   s.start.resume ? "and optimizer state loaded"
                                   : o_.from_scratch ? "initialised"
                                                     : "loaded",
                                   seconds_since(t_setup)));
    }
    s.schedule.peak_lr = o_.learning_rate;
    s.schedule.total_steps = o_.steps;
    s.schedule.warmup_steps = o_.warmup_steps();
    s.schedule.cooldown_steps = o_.cooldown;
    s.schedule.final_lr_fraction = o_.final_lr_fraction;
    s.schedule.decay = parse_lr_decay(o_.lr_schedule);
    if (lead_ && o_.steps > 0 && o_.warmup_steps() > o_.steps)
        s.log->message(fmt::format("note: --warmup={} is longer than --steps={}: the learning rate only rises, to "
                                   "{:.3g} ({:.0f}% of --learning-rate={:g}) at the last step, and never decays",
                                   o_.warmup_steps(), o_.steps, s.schedule.at(o_.steps - 1),
                                   100.0 * s.schedule.at(o_.steps - 1) / std::max(o_.learning_rate, 1e-30f),
                                   o_.learning_rate));
    s.last_checkpoint = s.resume_dir;
    s.last_checkpoint_step = step_;
}

// The state the run starts from on this rank: the resume point's (weights, optimizer state, data
// position; every rank loads the same checkpoint directory), else a random init or the --model
// directory's weights. Returns the first step to run.
int RankSession::load_start_state() {
    State& s = *s_;
    if (s.resume_state) {
        // LoRA checkpoints hold the adapters only: the frozen base comes from --model as at the start
        if (o_.lora_rank > 0) load_base_weights();
        s.model->load_checkpoint(s.resume_dir);
        if (s.train_data) s.train_data->set_state(s.resume_state->train_data);
        return s.resume_state->step;
    }
    if (lead_ && o_.continue_from_checkpoint)
        s.log->message(fmt::format("[Resume] no checkpoint in '{}', starting from step 0", o_.checkpoint_dir));
    load_base_weights();
    return 0;
}

void RankSession::load_base_weights() {
    State& s = *s_;
    if (o_.from_scratch) {
        s.model->init_random(o_.seed);
    } else {
        const ModelSource& source = ctx_.source;
        QT_CHECK(source.directory, "--model: no weights to load for ", source.description, " (add --from-scratch)");
        if (lead_) s.log->message("Loading weights from " + *source.directory);
        s.model->load_hf(*source.directory);
    }
}

int64_t RankSession::forward_backward_step(const StepTokens* tokens) {
    State& s = *s_;
    const int B = o_.batch_size, T = o_.seq_len, accumulation = o_.grad_accumulation;
    const int64_t rows = static_cast<int64_t>(accumulation) * world_ * B;
    QT_CHECK(!tokens || tokens->rows == rows, "internal: a step's tokens must be ", rows, " rows");
    float grad_scale = 1.0f / static_cast<float>(accumulation * world_);
    // --loss-normalization=tokens: every micro-batch's summed loss is divided by the trained tokens of
    // the whole step over all ranks. The ranks' gradients are summed (not averaged) by the models'
    // data-parallel reduction, so the denominator is that global count and grad_scale 1: the summed
    // gradient is then exactly d(sum of the step's token losses) / count. Each rank counts every
    // rank's rows itself: they all walk one global order (DataLoader::set_rank), as StepTokens does.
    float loss_denominator = 0.0f;
    if (s.packing.token_normalization) {
        int64_t step_valid = 0;
        if (tokens) {
            for (int64_t i = 0; i < rows * T; ++i) step_valid += tokens->targets[i] >= 0;
        } else {
            step_valid = s.train_data->valid_targets_ahead(accumulation);
        }
        grad_scale = 1.0f;
        loss_denominator = static_cast<float>(step_valid);  // 0: no target anywhere, no loss either
    }
    int64_t valid = 0;
    for (int micro = 0; micro < accumulation; ++micro) {
        const int32_t *in, *tgt, *pos = nullptr;
        if (tokens) {
            // this rank's block of the micro-batch's world x batch rows (StepTokens)
            const int64_t first = (static_cast<int64_t>(micro) * world_ + rank_) * B * T;
            in = tokens->inputs + first;
            tgt = tokens->targets + first;
            if (s.packing.document_masking) {  // documents end after each EOS (packing_options.h)
                s.positions.resize(static_cast<size_t>(B) * T);
                positions_after_eos(in, B, T, ctx_.source.config.eos_token_id, s.positions.data());
                pos = s.positions.data();
            }
        } else {
            s.train_data->next_batch(s.inputs, s.targets, &s.positions);
            in = s.inputs.data();
            tgt = s.targets.data();
            if (!s.positions.empty()) pos = s.positions.data();  // packed rows (document masking)
        }
        for (int64_t i = 0; i < static_cast<int64_t>(B) * T; ++i) valid += tgt[i] >= 0;
        Batch batch{in, tgt, B, T};
        batch.positions = pos;
        batch.loss_denominator = loss_denominator;
        s.model->forward_backward(batch, grad_scale);
        // the --comm-timeout watchdog's feed: it bounds one micro-batch, not a whole step of many
        if (s.watchdog) s.watchdog->feed();
    }
    return valid;
}

StepReport RankSession::step(const StepTokens* tokens, std::optional<float> lr_override) {
    State& s = *s_;
    QT_CHECK(tokens || s.train_data, "no --train-file: give this step's tokens (inputs and targets)");
    if (gradients_pending_) {  // compute_gradients' gradients are not this step's
        s.model->zero_gradients();
        gradients_pending_ = false;
    }
    StepReport r;
    r.step = step_;
    r.tokens = static_cast<int64_t>(o_.grad_accumulation) * world_ * o_.batch_size * o_.seq_len;
    WatchdogScope watched(s.watchdog.get(), fmt::format("step {}", step_));
    maybe_fail_for_test(ctx_.test_fault, rank_, step_);
    const auto t0 = Clock::now();
    const int64_t valid = forward_backward_step(tokens);
    r.lr = lr_override ? *lr_override : s.schedule.at(step_);
    const StepStats stats = s.model->optimizer_step(
        OptimizerParams{r.lr, o_.beta_1, o_.beta_2, o_.adam_epsilon, o_.weight_decay, o_.grad_clip, step_ + 1});
    r.loss = stats.loss;
    r.grad_norm = stats.grad_norm;
    // every rank decides alike: the global target count, and one stop for all on any rank's signal
    const bool signalled = ctx_.stop_signal && ctx_.stop_signal->load() != 0;
    const StepAgreement agreed = agree_after_step(host_, signalled, valid);
    r.ms = ms_since(t0);
    if (lead_) {
        s.log->log_step(step_, s.train_data ? s.train_data->epoch_progress() : 0.0, r.tokens, r.ms, stats.grad_norm,
                        stats.loss, r.lr);
        if (std::string notes = s.model->performance_notes(); !notes.empty()) s.log->message(notes);
    }
    // the model applied no update (imodel.h); its stats are the same on every rank
    if (!IModel::update_allowed(stats)) {
        const bool finite = std::isfinite(stats.loss) && std::isfinite(stats.grad_norm);
        if (finite && agreed.valid_targets == 0) {
            r.applied = false;
            if (lead_)
                s.log->message(fmt::format("note: step {} had no unmasked target (every loss position masked): "
                                           "nothing to learn, no update applied", step_));
        } else {
            // Rank 0 reports the stop; the others end without an error of their own (under mpirun
            // a second failing process could end the job before rank 0's message is out).
            if (!lead_) {
                r.ended = true;
                return r;
            }
            stop_at_broken_step(step_, stats.loss, stats.grad_norm, agreed.valid_targets);
        }
    }

    if (s.watchdog) s.watchdog->disarm();  // (the checkpoint below is not timed)
    const int completed = ++step_;
    if (s.eval_data && o_.eval_every_n_steps > 0 && completed % o_.eval_every_n_steps == 0) {
        evaluate();
        r.evaluated = true;
    }
    const bool periodic = o_.ckpt_interval > 0 && completed % o_.ckpt_interval == 0;
    if (periodic) write_checkpoint_now(completed);
    if (agreed.stop) {
        if (lead_) {
            const int sig = ctx_.stop_signal->load();
            s.log->message(sig ? fmt::format("\nStopping on signal {} after step {}", sig, completed - 1)
                               : fmt::format("\nStopping after step {}: another rank received a stop signal",
                                             completed - 1));
        }
        if (!periodic && !o_.checkpoint_dir.empty()) write_checkpoint_now(completed);
        r.stop = true;
    }
    return r;
}

void RankSession::compute_gradients(const StepTokens& tokens) {
    State& s = *s_;
    s.model->zero_gradients();  // (a backend that cannot refuses here, before any work)
    WatchdogScope watched(s.watchdog.get(), fmt::format("compute_gradients before step {}", step_));
    forward_backward_step(&tokens);
    gradients_pending_ = true;
}

void RankSession::stop_at_broken_step(int step, float loss, float grad_norm, int64_t valid_targets) {
    const State& s = *s_;
    const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
    const std::string what =
        finite ? cat("the gradient vanished (norm exactly 0 with ", valid_targets, " targets, loss ", loss,
                     "): the activations have saturated, so the weights no longer affect the loss")
               : cat("the loss or the gradient norm is not finite (loss ", loss, ", grad norm ", grad_norm, ")");
    s.log->log_stopped(step, what);
    throw_error(cat("training stopped at step ", step, ": ", what,
                    ". The step's update was not applied and no checkpoint was written from it. ",
                    s.last_checkpoint.empty()
                        ? std::string("There is no checkpoint of this run. ")
                        : cat("The last checkpoint is ", s.last_checkpoint, " (after ", s.last_checkpoint_step,
                              " steps); if the run was unstable before it, it may hold the damage already. "),
                    "Try a lower --learning-rate (now ", o_.learning_rate, ") or --grad-clip",
                    s.last_checkpoint.empty() ? std::string(".")
                                              : std::string(", resuming with --continue --force-resume and the new "
                                                            "value, or from an earlier checkpoint.")));
}

// Rank 0: the [Setup] lines of packing (--document-masking) and the loss normalisation.
void RankSession::log_packing() {
    State& s = *s_;
    if (s.packing.document_masking) {
        for (const auto& [name, loader] : {std::pair{"train", s.train_data.get()}, std::pair{"eval", s.eval_data.get()}}) {
            if (!loader) continue;
            const PackStats& p = loader->pack_stats();
            s.log->message(fmt::format(
                "[Setup] {} data packed with document masking: {} documents into {} rows of {} tokens, fill rate "
                "{:.1f}% (document tokens / row slots; {:.1f}% of the slots have a trained target), {} documents "
                "longer than --seq-len split",
                name, p.documents, p.rows, o_.seq_len, 100.0 * p.fill_rate(o_.seq_len),
                p.rows ? 100.0 * static_cast<double>(p.trained_targets) / (static_cast<double>(p.rows) * o_.seq_len) : 0.0,
                p.split_documents));
        }
    }
    if (s.packing.document_masking || s.packing.token_normalization)
        s.log->message(fmt::format("[Setup] --document-masking={} (given {}), loss normalised over {}",
                                   s.packing.document_masking ? "on" : "off", o_.document_masking,
                                   s.packing.token_normalization
                                       ? "the trained tokens of each optimizer step (all micro-batches and ranks)"
                                       : "each micro-batch"));
}

EvalResult RankSession::evaluate() {
    State& s = *s_;
    QT_CHECK(s.eval_data, "no --eval-file: there is nothing to evaluate on");
    const auto t0 = Clock::now();
    WatchdogScope watched(s.watchdog.get(), fmt::format("the evaluation after step {}", step_));
    ProgressWatchdog* watchdog = s.watchdog.get();
    const EvalResult r = evaluate_over_ranks(*s.model, *s.eval_data, o_.eval_num_steps, o_.batch_size, o_.seq_len,
                                             host_, [watchdog] {
                                                 if (watchdog) watchdog->feed();
                                             });
    evaluated_at_ = step_;
    if (lead_)
        s.log->log_eval(step_, s.train_data ? s.train_data->epoch_progress() : 0.0, r.tokens, ms_since(t0), r.loss);
    return r;
}

std::string RankSession::save_checkpoint() { return write_checkpoint_now(step_); }

std::string RankSession::write_checkpoint_now(int completed_steps) {
    State& s = *s_;
    const auto t0 = Clock::now();
    CheckpointState st;  // rank 0's is the one written
    st.step = completed_steps;
    if (lead_) {
        // what killed runs left in --checkpoint-dir goes before this run adds to it
        for (const RemovedDir& r : remove_partial_checkpoints(o_.checkpoint_dir))
            s.log->log_checkpoint_removed(completed_steps, r.path, r.bytes, r.reason, r.error);
        if (s.train_data) st.train_data = s.train_data->state();  // the same on every rank (DataLoader::set_rank)
        st.options_json = o_.to_json();
        st.config_json = model_config_to_json(ctx_.source.config);
        st.device = ctx_.device;
        if (s.train_data)
            for (const auto& file : s.train_data->files()) st.train_files.emplace_back(file->path(), file->size());
    }
    const std::string dir = write_checkpoint(host_, o_.checkpoint_dir, *s.model, st);
    s.last_checkpoint = dir;
    s.last_checkpoint_step = completed_steps;
    if (lead_) {
        s.log->log_checkpoint(completed_steps, dir, ms_since(t0));
        for (const RemovedDir& r : prune_checkpoints(o_.checkpoint_dir, o_.ckpt_keep, dir))
            s.log->log_checkpoint_removed(completed_steps, r.path, r.bytes, r.reason, r.error);
    }
    return dir;
}

void RankSession::load_checkpoint(const std::string& dir) {
    State& s = *s_;
    // Rank 0 verifies it and checks it is this run's (as --continue does), then every rank loads it.
    std::string error;
    if (lead_) {
        try {
            RunStart start;
            ResumePoint point;
            point.dir = dir;
            QT_CHECK(fs::is_directory(dir), "load_checkpoint: '", dir, "' is not a directory");
            point.verified = verify_checkpoint(dir);
            point.state = read_checkpoint_state(dir);
            start.resume = point;
            check_resume_point(start, o_, ctx_.device, ctx_.source.config, world_, ctx_.ranks_source, "load_checkpoint");
            if (s.train_data) check_resume_train_files(start, *s.train_data, o_);
            for (const OptionChange& c : start.changes)
                s.log->message(cat("[Resume] ", c.changes_run ? "--force-resume: " : "", describe_option_change(c)));
        } catch (const std::exception& e) {
            error = e.what();
        }
    }
    // a refusal stops every rank alike, before any loads
    error = comm::broadcast_string(host_, error);
    if (!error.empty()) {
        if (lead_) throw_error(error);
        throw_error("rank 0 refused the checkpoint: " + error);
    }
    const CheckpointState st = read_checkpoint_state(dir);
    s.model->load_checkpoint(dir);
    if (s.train_data) s.train_data->set_state(st.train_data);
    step_ = st.step;
    s.last_checkpoint = dir;
    s.last_checkpoint_step = st.step;
    if (lead_) s.log->log_resume(step_, dir);
}

std::vector<float> RankSession::read_tensor(const std::string& name, IModel::TensorKind kind) {
    return s_->model->read_tensor(name, kind);
}

void RankSession::export_model(const std::string& dir) {
    State& s = *s_;
    const bool collective = s.model->saves_collectively();
    if (!lead_ && !collective) return;
    if (lead_) fs::create_directories(dir);
    s.model->save_hf(dir);
    if (lead_) export_files(dir);
}

// Rank 0: what goes beside the weights (config and tokenizer files).
void RankSession::export_files(const std::string& dir) {
    State& s = *s_;
    if (ctx_.source.directory) copy_model_dir_files(*ctx_.source.directory, dir, !ctx_.tokenizer);
    if (ctx_.tokenizer) {
        const std::vector<std::string> files = export_hf_tokenizer(*ctx_.tokenizer, dir);
        std::string names;
        for (const std::string& f : files) names += (names.empty() ? "" : ", ") + f;
        s.log->message(cat("[Setup] tokenizer files written: ", names, " (from ", ctx_.tokenizer->source(), ")"));
    }
}

int RankSession::finish() {
    State& s = *s_;
    // the op timer's table of the training steps (before the final evaluation adds its scopes, and before
    // the export, during which a benchmark stops the run: bench_qtrain.sh waits for this table)
    // (the other ranks' tables: their models' destructors print them, as before)
    if (lead_)
        if (std::string table = s.model->take_time_breakdown(); !table.empty()) {
            if (table.back() == '\n') table.pop_back();
            s.log->message(table);
        }
    if (evaluated_at_ != step_ && s.eval_data) evaluate();
    // Rank 0 exports. The training is worth more than the export: when it fails, every rank keeps
    // the state in a checkpoint (collective) that the export can be redone from. With sharded
    // weights (ZeRO-3; LoRA's adapter blocks on the GPU) save_hf is collective (imodel.h): every rank calls it, even when rank 0
    // could not create the directory, so that no rank waits for another in it; rank 0 writes.
    const auto t_export = Clock::now();
    const bool collective = s.model->saves_collectively();
    std::string export_error;
    if (lead_ || collective) {
        std::string dir_error;
        if (lead_) {
            std::error_code ec;
            fs::create_directories(o_.out_dir, ec);
            if (ec) dir_error = cat("--out-dir: cannot create '", o_.out_dir, "': ", ec.message());
        }
        try {
            if (dir_error.empty() || collective) s.model->save_hf(o_.out_dir);
        } catch (const std::exception& e) {
            export_error = e.what();
        }
        if (!dir_error.empty()) export_error = dir_error;  // the cause, not save_hf's failure after it
    }
    const double failed_here = export_error.empty() ? 0.0 : 1.0;
    double failed = 0.0;
    comm::sum_scalars_over_ranks(host_, &failed_here, &failed, 1);
    if (failed > 0.0) {
        std::string kept = s.last_checkpoint_step == step_ ? s.last_checkpoint : std::string();
        if (kept.empty()) {
            try {
                kept = write_checkpoint_now(step_);
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
    s.log->message(fmt::format("[Setup] model exported in {:.1f} s", seconds_since(t_export)));
    export_files(o_.out_dir);
    // a LoRA run exports the PEFT adapter (unless --merge-lora): the done line names that file
    const bool adapter = o_.lora_rank > 0 && !o_.merge_lora;
    s.log->log_done(step_, o_.out_dir, seconds_since(ctx_.t_start), adapter ? kAdapterWeightsFile : "model.safetensors");
    return 0;
}

}  // namespace qtrain
