#include "train/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include <fmt/core.h>

#include "comm/thread_world.h"
#include "core/error.h"
#include "core/files.h"
#include "model/imodel.h"
#include "tokenizer/hf_tokenizer_export.h"
#include "train/checkpointer.h"
#include "train/data_loader.h"
#include "train/logger.h"
#include "train/lr_schedule.h"
#include "train/memory_fit.h"
#include "train/model_factory.h"
#include "train/output_tokenizer.h"
#include "train/rank_threads.h"
#include "train/resume_check.h"
#include "train/run_guard.h"
#include "train/sol.h"

namespace qtrain {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int64_t count_valid(const std::vector<int32_t>& targets) {
    int64_t n = 0;
    for (int32_t t : targets) n += t >= 0;
    return n;
}

// Mean loss over the eval set's valid targets (each batch weighted by its valid-target count).
float evaluate(IModel& model, DataLoader& loader, int max_batches, int batch_size, int seq_len, int64_t* tokens) {
    loader.restart();
    std::vector<int32_t> in, tgt;
    double loss_sum = 0;
    int64_t valid = 0;
    *tokens = 0;
    for (int b = 0; (max_batches == 0 || b < max_batches) && loader.next_batch_no_wrap(in, tgt); ++b) {
        const int64_t n = count_valid(tgt);
        if (n == 0) continue;
        const float loss = model.evaluate(Batch{in.data(), tgt.data(), batch_size, seq_len});
        loss_sum += static_cast<double>(loss) * n;
        valid += n;
        *tokens += static_cast<int64_t>(batch_size) * seq_len;
    }
    return valid ? static_cast<float>(loss_sum / valid) : NAN;
}

// The files of a HF model directory besides the weights and config.json that the export carries
// over: generation_config.json always, the tokenizer's files unless --tokenizer gave them.
void copy_model_dir_files(const std::string& from_dir, const std::string& to_dir, bool tokenizer_files) {
    for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
                             "merges.txt", "special_tokens_map.json"}) {
        if (!tokenizer_files && std::string(name) != "generation_config.json") continue;
        fs::path src = fs::path(from_dir) / name;
        std::error_code ec;
        if (fs::exists(src, ec)) fs::copy_file(src, fs::path(to_dir) / name, fs::copy_options::overwrite_existing, ec);
    }
}

// One step's micro-batches on `model`: returns the targets that carry a loss.
int64_t run_micro_batches(IModel& model, DataLoader& data, int accumulation, int batch_size, int seq_len,
                          float grad_scale, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
    int64_t valid = 0;
    for (int micro = 0; micro < accumulation; ++micro) {
        data.next_batch(inputs, targets);
        valid += count_valid(targets);
        model.forward_backward(Batch{inputs.data(), targets.data(), batch_size, seq_len}, grad_scale);
    }
    return valid;
}

// The state a run starts from: the resume point's (weights, optimizer state, data position), else a
// random init or the --model directory's weights. Returns the first step to run.
int load_start_state(IModel& model, DataLoader& data, const std::optional<ResumePoint>& resume,
                     const TrainOptions& o, const ModelSource& source) {
    if (resume) {
        model.load_checkpoint(resume->dir);
        data.set_state(resume->state.train_data);
        return resume->state.step;
    }
    if (o.from_scratch) {
        model.init_random(o.seed);
    } else {
        QT_CHECK(source.directory, "--model: no weights to load for ", source.description, " (add --from-scratch)");
        model.load_hf(*source.directory);
    }
    return 0;
}

}  // namespace

Trainer::Trainer(TrainOptions options, std::string command_line)
    : opt_(std::move(options)), command_line_(std::move(command_line)) {}

int Trainer::run() {
    const auto t_start = Clock::now();
    opt_.validate();
    std::string device = resolve_device(opt_.device, !opt_.plan_only);
    // a plan is made for the machine that will train, so on a machine without a GPU --plan-only
    // still plans for the GPU unless told --device=cpu
    const bool planning_for_gpu = opt_.plan_only && opt_.device == "auto" && device == "cpu" && cuda_backend_built();
    if (planning_for_gpu) device = "cuda";
    const ModelSource source = resolve_model_source(opt_);
    const ModelConfig& cfg = source.config;
    QT_CHECK(opt_.seq_len <= cfg.max_position_embeddings, "--seq-len=", opt_.seq_len,
             " is longer than the model's max_position_embeddings (", cfg.max_position_embeddings, ", ",
             source.description, "): positions beyond it were never trained; use --seq-len<=",
             cfg.max_position_embeddings, " (or raise max_position_embeddings in the model's config.json if you mean to "
             "extend the context)");
    // loaded now (a second or so for Qwen's 7 MB tokenizer.json), though only written at the end
    const std::optional<Tokenizer> tokenizer =
        opt_.plan_only ? std::nullopt : load_output_tokenizer(opt_.tokenizer, cfg.vocab_size);
    const ModelOptions mopt = opt_.model_options(device);
    // Threads mode on the CPU model: --gpus ranks, each a model of its own in this process
    // (rank_threads.h). The GPU model refuses --gpus > 1 itself (multi-GPU is issue 18's next step).
    const int world = device == "cpu" ? std::max(1, opt_.gpus) : 1;
    // The CPU model's plan is host memory: a training run checks it against this machine's RAM (a
    // batch that does not fit would be killed by the OOM killer minutes later), like the pinned plan;
    // with several CPU ranks each gets its share of it.
    const uint64_t ram_limit = device == "cpu" && !opt_.plan_only ? usable_host_memory() / world : 0;
    const uint64_t limit = ram_limit && (!mopt.memory_limit || ram_limit < mopt.memory_limit) ? ram_limit
                                                                                              : mopt.memory_limit;
    const std::string limit_name =
        limit && limit == ram_limit
            ? (world > 1 ? cat("this machine can give each of the ", world, " CPU ranks about ")
                         : std::string("this machine can give the CPU model about "))
            : std::string("--memory-limit is ");
    if (planning_for_gpu)
        std::printf("note: no GPU here; --plan-only plans for the GPU (--device=cuda). --device=cpu plans the CPU "
                    "reference model instead\n\n");

    const MemoryPlan plan = plan_model(cfg, mopt, device);
    if (limit && plan.total_device() > limit) {
        Logger("/dev/null", true).log_memory(plan, limit);  // show where the memory goes, then fail
        const std::string fit = flags_that_fit(cfg, mopt, device, limit);
        const int fitting_batch = largest_batch_that_fits(cfg, mopt, device, limit, 0, mopt.batch_size);
        const std::string smaller = fitting_batch > 0
                                        ? cat("with the current flags --batch-size=", fitting_batch, " fits")
                                        : std::string("with the current flags not even --batch-size=1 fits");
        throw_error(cat("the memory plan needs ", human_bytes(plan.total_device()), " but ", limit_name,
                        human_bytes(limit), "; ",
                        fit.empty() ? cat("no recompute, offload or streaming setting makes it fit: reduce --batch-size "
                                          "or --seq-len (", smaller, ")")
                                    : cat("it fits with ", fit, " (or reduce --batch-size or --seq-len; ", smaller, ")")));
    }
    // Pinned memory cannot be swapped: a plan larger than the host fails here, not minutes later in
    // cudaHostAlloc or the OOM killer.
    const bool explicit_host = !opt_.host_memory_limit.empty();
    const uint64_t host_limit = explicit_host ? parse_bytes(opt_.host_memory_limit, "--host-memory-limit")
                                : opt_.plan_only ? 0
                                                 : usable_host_memory();
    if (host_limit && plan.total_pinned() > host_limit) {
        Logger("/dev/null", true).log_memory(plan, limit);
        const std::string fit = pinned_flags_that_fit(cfg, mopt, device, limit, host_limit);
        throw_error(cat("the memory plan pins ", human_bytes(plan.total_pinned()), " of host memory but ",
                        explicit_host ? "--host-memory-limit is " : "this machine can pin about ", human_bytes(host_limit),
                        "; ",
                        fit.empty() ? std::string("no bf16 precision flag makes it fit: offload less, or use a machine "
                                                  "with more memory (or more GPUs, which shard it)")
                                    : cat("it fits with ", fit)));
    }
    if (opt_.plan_only) {
        Logger plan_logger("/dev/null", true);
        plan_logger.log_memory(plan, limit);
        // a plan may be made for another machine, so only a note: a training run here would fail
        if (const uint64_t here = usable_host_memory(); !explicit_host && here && plan.total_pinned() > here)
            plan_logger.message(cat("note: the plan pins ", human_bytes(plan.total_pinned()),
                                    " of host memory; this machine can pin about ", human_bytes(here),
                                    ", so training here would fail before allocating (--host-memory-limit checks "
                                    "a plan against another machine's memory)"));
        if (limit) {  // how far the micro-batch could grow under the limit with these flags
            constexpr int kCap = 4096;
            auto largest_with = [&](const ModelOptions& o) {
                return largest_batch_that_fits(cfg, o, device, limit, explicit_host ? host_limit : 0,
                                               std::max(kCap, mopt.batch_size));
            };
            auto up_to = [&](int b) { return cat("--batch-size up to ", b, b >= kCap ? " (or more)" : ""); };
            const int largest = largest_with(mopt);
            plan_logger.message(cat("note: with these flags ", up_to(largest), " fits --memory-limit=", human_bytes(limit),
                                    explicit_host ? " and --host-memory-limit" : "",
                                    " (the plan leaves out the CUDA context and libraries: ~0.7 GiB more on an H200); "
                                    "streamed runs (--shard-weights, --offload-gradients) move their weights and "
                                    "gradients over PCIe once per micro-batch, so a larger one is usually faster"));
            // Streamed runs' largest remaining activation is the residual stream kept per layer; moving
            // it to pinned memory costs little there (7B under 24 GiB: 25 -> 38 sequences, 8.5k -> 10.1k
            // tokens/s, docs/benchmarks.md), so say what it would allow.
            if (mopt.shard_weights && !mopt.offload_residual) {
                ModelOptions r = mopt;
                r.offload_residual = true;
                if (const int with_res = largest_with(r); with_res > largest) {
                    r.batch_size = with_res;
                    plan_logger.message(cat("note: with --offload-residual as well, ", up_to(with_res), " fits (pinning ",
                                            human_bytes(plan_model(cfg, r, device).total_pinned()),
                                            " at that size); the residual copies overlap the streamed step"));
                }
            }
        }
        return 0;
    }

    // Everything this run will write is checked before the model takes memory and time.
    probe_writable_dir(opt_.out_dir, "--out-dir");
    probe_writable_dir(fs::path(opt_.log_path()).parent_path().string(), "--log-file");
    probe_writable_dir(opt_.checkpoint_dir, "--checkpoint-dir");

    // Resume state, if any (before the log file is opened, so a fresh run truncates it).
    // Newest first: a checkpoint whose files fail their checksums (or whose state.json does not read)
    // is reported and the one before it tried; none left is an error, never a silent step 0. This runs
    // before the model is allocated (verifying a large checkpoint takes minutes); the rejections go to
    // the log once it is open.
    std::optional<ResumePoint> resume;
    std::vector<std::pair<std::string, std::string>> rejected;
    if (opt_.continue_from_checkpoint && !list_complete_checkpoints(opt_.checkpoint_dir).empty()) {
        // hashing a large checkpoint takes minutes (a 7B one is ~100 GB): say what is going on
        std::printf("[Resume] checking the checkpoints in '%s' (newest first)\n", opt_.checkpoint_dir.c_str());
        std::fflush(stdout);
        const auto t_verify = Clock::now();
        resume = find_resume_point(opt_.checkpoint_dir, [&](const std::string& dir, const std::string& error) {
            std::printf("[Resume] cannot resume from %s: %s\n", dir.c_str(), error.c_str());
            std::fflush(stdout);
            rejected.emplace_back(dir, error);
        });
        if (resume->verified)
            std::printf("[Resume] %s: every file matches its checksum (%.1f s)\n", resume->dir.c_str(),
                        std::chrono::duration<double>(Clock::now() - t_verify).count());
    }
    const std::optional<std::string> resume_dir = resume ? std::optional<std::string>(resume->dir) : std::nullopt;
    std::vector<OptionChange> resume_changes;
    bool append_log = false;
    if (resume) {
        const CheckpointState& st = resume->state;
        resume_changes = compare_resume_options(st.options_json, st.device, st.config_json, opt_, device, cfg);
        std::string refused;
        for (const OptionChange& c : resume_changes)
            if (c.changes_run) refused += "\n  " + describe_option_change(c);
        QT_CHECK(refused.empty() || opt_.force_resume, "--continue: this run differs from the one that wrote ",
                 *resume_dir, " in options that change the math or the data:", refused,
                 "\nGive the checkpoint's values to resume it, a new --checkpoint-dir to start another run, or "
                 "--force-resume to resume with these changes anyway");
    } else if (opt_.continue_from_checkpoint) {
        // a typo in --checkpoint-dir must not start over and replace the run it meant to resume
        std::vector<std::string> existing = existing_run_output(opt_);
        bool own_log = false;
        if (!existing.empty() && existing.front() == opt_.log_path() &&
            log_is_of_this_run(opt_.log_path(), opt_, device, cfg)) {
            own_log = true;
            append_log = true;  // this run's own log: it restarts before its first checkpoint
            existing.erase(existing.begin());
            if (existing.empty())
                std::printf("[Resume] no checkpoint in '%s' yet: this run starts from step 0, appending to its log %s\n",
                            opt_.checkpoint_dir.c_str(), opt_.log_path().c_str());
        }
        std::string list;
        for (const auto& path : existing) list += (list.empty() ? "'" : ", '") + path + "'";
        QT_CHECK(existing.empty() || opt_.overwrite, "--continue: no complete checkpoint in --checkpoint-dir '",
                 opt_.checkpoint_dir, "', but ", list, " hold", existing.size() == 1 ? "s" : "",
                 own_log ? " the output of this same run, which finished without writing a checkpoint to resume from"
                           " (--ckpt-interval); starting from step 0 would replace it"
                         : " another run's output, which starting from step 0 would replace",
                 ". Check --checkpoint-dir, or add --overwrite to start from step 0 anyway");
    } else if (const auto old = find_latest_checkpoint(opt_.checkpoint_dir)) {
        // a fresh run's checkpoints would mix with another run's, and --continue would pick the newest
        QT_CHECK(opt_.overwrite, "--checkpoint-dir '", opt_.checkpoint_dir, "' holds checkpoints of another run (newest: ",
                 *old, "): add --continue to resume it, choose another --checkpoint-dir, or add --overwrite to "
                 "remove them and start from step 0");
        for (const auto& dir : list_complete_checkpoints(opt_.checkpoint_dir)) fs::remove_all(dir);
        std::printf("[Setup] --overwrite: removed the checkpoints in '%s'\n", opt_.checkpoint_dir.c_str());
    }

    Logger log(opt_.log_path(), resume_dir.has_value() || append_log);
    for (const auto& [dir, error] : rejected) log.log_checkpoint_rejected(dir, error, /*print=*/false);
    log.log_options(opt_, command_line_);
    double peak = 0;
    log.log_system(device, describe_device(device, cfg, mopt, &peak), peak);
    log.log_model(source.description, cfg.num_parameters(), model_config_to_json(cfg));

    DataLoader train_data(expand_glob(opt_.train_file, "--train-file"), opt_.batch_size, opt_.seq_len, opt_.seed, true,
                          cfg.vocab_size, "--train-file");
    std::unique_ptr<DataLoader> eval_data;
    if (!opt_.eval_file.empty())
        eval_data = std::make_unique<DataLoader>(expand_glob(opt_.eval_file, "--eval-file"), opt_.batch_size,
                                                 opt_.seq_len, opt_.seed, false, cfg.vocab_size, "--eval-file");
    log.log_dataset("train", train_data);
    if (resume && !resume->state.train_files.empty()) {
        // the data order is a function of the chunks of these files: other files (a shard added under the
        // same glob, a re-tokenised file) make another run
        std::vector<std::pair<std::string, int64_t>> now;
        for (const auto& file : train_data.files()) now.emplace_back(file->path(), file->size());
        if (now != resume->state.train_files) {
            auto list = [](const std::vector<std::pair<std::string, int64_t>>& files) {
                std::string out;
                for (std::size_t i = 0; i < files.size() && i < 4; ++i)
                    out += cat(i ? ", " : "", files[i].first, " (", files[i].second, " tokens)");
                return files.size() > 4 ? cat(out, ", ... (", files.size(), " files)") : out;
            };
            const std::string what = cat("--train-file: the checkpoint's run trained on ", list(resume->state.train_files),
                                         "; this run's files are ", list(now));
            QT_CHECK(opt_.force_resume, "--continue: this run differs from the one that wrote ", resume->dir,
                     " in its data:\n  ", what, "\nThe data order would differ; resume with the same files, or add "
                     "--force-resume to resume on these anyway");
            resume_changes.push_back({"--train-file (files)", list(resume->state.train_files), list(now), true, ""});
        }
    }
    if (eval_data) log.log_dataset("eval", *eval_data);

    log.log_memory(plan, limit);
    // set-up phases are timed: for a 14B model with 110 GiB pinned they take minutes
    auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
    auto t_setup = Clock::now();
    std::unique_ptr<IModel> model = create_model(cfg, mopt, device);
    log.message(fmt::format("[Setup] model created and its memory allocated in {:.1f} s", seconds_since(t_setup)));
    // per-tensor work on a large model takes minutes: a line every 10 s or so, none for small models
    auto last_progress = std::make_shared<Clock::time_point>(Clock::now());
    model->set_progress([&log, last_progress](const char* what, int64_t done, int64_t total) {
        if (done >= total || std::chrono::duration<double>(Clock::now() - *last_progress).count() < 10.0) return;
        *last_progress = Clock::now();
        log.message(fmt::format("[Setup] {}: {:.0f}% ({:.2f}G of {:.2f}G parameters)", what, 100.0 * done / total,
                                done / 1e9, total / 1e9));
    });
    log.log_sol(training_flops_per_token(cfg, opt_.seq_len), peak);
    t_setup = Clock::now();

    if (!resume && opt_.continue_from_checkpoint)
        log.message(fmt::format("[Resume] no checkpoint in '{}', starting from step 0", opt_.checkpoint_dir));
    if (!resume && !opt_.from_scratch && source.directory) log.message("Loading weights from " + *source.directory);
    const int start_step = load_start_state(*model, train_data, resume, opt_, source);
    if (resume) {
        log.log_resume(start_step, resume->dir, resume->skipped, resume->verified);
        for (const OptionChange& c : resume_changes)
            log.message(cat("[Resume] ", c.changes_run ? "--force-resume: " : "", describe_option_change(c)));
        log.log_option_changes(resume_changes);
    }
    log.message(fmt::format("[Setup] parameters {} in {:.1f} s",
                            resume_dir ? "and optimizer state loaded" : opt_.from_scratch ? "initialised" : "loaded",
                            seconds_since(t_setup)));

    LrSchedule schedule;
    schedule.peak_lr = opt_.learning_rate;
    schedule.total_steps = opt_.steps;
    schedule.warmup_steps = opt_.warmup_steps();
    schedule.cooldown_steps = opt_.cooldown;
    schedule.final_lr_fraction = opt_.final_lr_fraction;
    schedule.decay = parse_lr_decay(opt_.lr_schedule);

    std::string last_checkpoint = resume_dir.value_or("");
    int last_checkpoint_step = start_step;
    auto save_checkpoint = [&](int completed_steps) {
        auto t0 = Clock::now();
        // what killed runs left in --checkpoint-dir goes before this run adds to it
        for (const RemovedDir& r : remove_partial_checkpoints(opt_.checkpoint_dir))
            log.log_checkpoint_removed(completed_steps, r.path, r.bytes, r.reason, r.error);
        CheckpointState st;
        st.step = completed_steps;
        st.train_data = train_data.state();
        st.options_json = opt_.to_json();
        st.config_json = model_config_to_json(cfg);
        st.device = device;
        for (const auto& file : train_data.files()) st.train_files.emplace_back(file->path(), file->size());
        std::string dir = write_checkpoint(opt_.checkpoint_dir, *model, st);
        log.log_checkpoint(completed_steps, dir, ms_since(t0));
        last_checkpoint = dir;
        last_checkpoint_step = completed_steps;
        for (const RemovedDir& r : prune_checkpoints(opt_.checkpoint_dir, opt_.ckpt_keep, dir))
            log.log_checkpoint_removed(completed_steps, r.path, r.bytes, r.reason, r.error);
    };
    auto run_eval = [&](int step) {
        if (!eval_data) return;
        auto t0 = Clock::now();
        int64_t tokens = 0;
        float loss = evaluate(*model, *eval_data, opt_.eval_num_steps, opt_.batch_size, opt_.seq_len, &tokens);
        log.log_eval(step, train_data.epoch_progress(), tokens, ms_since(t0), loss);
    };

    g_stop_signal.store(0);
    auto old_int = std::signal(SIGINT, on_stop_signal);
    auto old_term = std::signal(SIGTERM, on_stop_signal);
    struct RestoreSignals {
        decltype(old_int) i, t;
        ~RestoreSignals() { std::signal(SIGINT, i); std::signal(SIGTERM, t); }
    } restore{old_int, old_term};

    // Threads mode: ranks 1..world-1 train the same steps on their share of each micro-batch group and
    // meet this one (rank 0, which logs, evaluates, checkpoints and exports) in the model's collectives
    // and once per step in agree_after_step.
    const float grad_scale = 1.0f / static_cast<float>(opt_.grad_accumulation * world);
    auto optimizer_params = [&](int step) {
        return OptimizerParams{schedule.at(step), opt_.beta_1,     opt_.beta_2, opt_.adam_epsilon,
                               opt_.weight_decay, opt_.grad_clip, step + 1};
    };
    const int zero_level = mopt.shard_gradients ? 2 : 1;
    std::unique_ptr<comm::ThreadWorld> thread_world;
    std::unique_ptr<RankThreads> ranks;
    if (world > 1) {
        thread_world = std::make_unique<comm::ThreadWorld>(world);
        ranks = std::make_unique<RankThreads>(*thread_world, [&](comm::Communicator& c) {
            std::unique_ptr<IModel> m = create_model(cfg, mopt, device);
            m->set_communicator(&c, zero_level);
            DataLoader data(expand_glob(opt_.train_file, "--train-file"), opt_.batch_size, opt_.seq_len, opt_.seed,
                            true, cfg.vocab_size, "--train-file");
            data.set_rank(c.rank(), world);
            std::vector<int32_t> in, tgt;
            for (int s = load_start_state(*m, data, resume, opt_, source); s < opt_.steps; ++s) {
                const int64_t valid = run_micro_batches(*m, data, opt_.grad_accumulation, opt_.batch_size,
                                                        opt_.seq_len, grad_scale, in, tgt);
                const StepStats st = m->optimizer_step(optimizer_params(s));
                const StepAgreement a = agree_after_step(c, false, valid);
                const bool skipped = std::isfinite(st.loss) && std::isfinite(st.grad_norm) && a.valid_targets == 0;
                if ((!IModel::update_allowed(st) && !skipped) || a.stop) return;  // rank 0 stops the run
            }
        });
        model->set_communicator(&ranks->rank0(), zero_level);
        train_data.set_rank(0, world);
        log.message(cat("[Setup] threads mode: ", world, " CPU ranks, ZeRO-", zero_level,
                        " (rank 0 logs, evaluates, checkpoints and exports)"));
    }

    std::vector<int32_t> inputs, targets;
    const int64_t step_tokens =
        static_cast<int64_t>(opt_.batch_size) * opt_.seq_len * opt_.grad_accumulation * world;
    int step = start_step;
    bool evaluated_last = false;
    for (; step < opt_.steps; ++step) {
        auto t0 = Clock::now();
        int64_t valid_targets = run_micro_batches(*model, train_data, opt_.grad_accumulation, opt_.batch_size,
                                                  opt_.seq_len, grad_scale, inputs, targets);
        const OptimizerParams p = optimizer_params(step);
        const float lr = p.learning_rate;
        const StepStats stats = model->optimizer_step(p);
        bool stop = g_stop_signal.load() != 0;
        if (ranks) {  // the other ranks decide alike: the global target count, one stop for all
            const StepAgreement a = agree_after_step(ranks->rank0(), stop, valid_targets);
            valid_targets = a.valid_targets;
            stop = a.stop;
        }
        log.log_step(step, train_data.epoch_progress(), step_tokens, ms_since(t0), stats.grad_norm, stats.loss, lr);
        if (std::string notes = model->performance_notes(); !notes.empty()) log.message(notes);
        if (!IModel::update_allowed(stats)) {  // the model applied no update (imodel.h)
            const bool finite = std::isfinite(stats.loss) && std::isfinite(stats.grad_norm);
            if (finite && valid_targets == 0) {
                log.message(fmt::format("note: step {} had no unmasked target (every loss position masked): "
                                        "nothing to learn, no update applied", step));
            } else {
                const std::string what =
                    finite ? cat("the gradient vanished (norm exactly 0 with ", valid_targets,
                                 " targets, loss ", stats.loss, "): the activations have saturated, so the weights "
                                 "no longer affect the loss")
                           : cat("the loss or the gradient norm is not finite (loss ", stats.loss, ", grad norm ",
                                 stats.grad_norm, ")");
                log.log_stopped(step, what);
                throw_error(cat(
                    "training stopped at step ", step, ": ", what,
                    ". The step's update was not applied and no checkpoint was written from it. ",
                    last_checkpoint.empty()
                        ? std::string("There is no checkpoint of this run. ")
                        : cat("The last checkpoint is ", last_checkpoint, " (after ", last_checkpoint_step,
                              " steps); if the run was unstable before it, it may hold the damage already. "),
                    "Try a lower --learning-rate (now ", opt_.learning_rate, ") or --grad-clip",
                    last_checkpoint.empty() ? std::string(".")
                                            : std::string(", resuming with --continue --force-resume and the new "
                                                          "value, or from an earlier checkpoint.")));
            }
        }

        const int completed = step + 1;
        evaluated_last = false;
        if (opt_.eval_every_n_steps > 0 && completed % opt_.eval_every_n_steps == 0) {
            run_eval(completed);
            evaluated_last = true;
        }
        if (opt_.ckpt_interval > 0 && completed % opt_.ckpt_interval == 0) save_checkpoint(completed);
        if (stop) {
            log.message(fmt::format("\nStopping on signal {} after step {}", g_stop_signal.load(), step));
            if (!(opt_.ckpt_interval > 0 && completed % opt_.ckpt_interval == 0) && !opt_.checkpoint_dir.empty())
                save_checkpoint(completed);
            if (ranks) ranks->join();
            return 130;
        }
    }
    if (!evaluated_last) run_eval(step);

    t_setup = Clock::now();
    try {
        std::error_code ec;
        fs::create_directories(opt_.out_dir, ec);
        QT_CHECK(!ec, "--out-dir: cannot create '", opt_.out_dir, "': ", ec.message());
        model->save_hf(opt_.out_dir);
    } catch (const std::exception& e) {
        // the training is worth more than the export: keep it in a checkpoint the export can be redone from
        std::string kept = last_checkpoint_step == step ? last_checkpoint : std::string();
        if (kept.empty()) {
            try {
                save_checkpoint(step);
                kept = last_checkpoint;
            } catch (const std::exception& e2) {
                throw_error(cat("exporting the model to --out-dir '", opt_.out_dir, "' failed: ", e.what(),
                                "; saving a checkpoint instead failed too: ", e2.what()));
            }
        }
        throw_error(cat("exporting the model to --out-dir '", opt_.out_dir, "' failed: ", e.what(),
                        "; the trained state is in ", kept,
                        ": fix the cause and run the same command with --continue to export it"));
    }
    log.message(fmt::format("[Setup] model exported in {:.1f} s", seconds_since(t_setup)));
    if (source.directory) copy_model_dir_files(*source.directory, opt_.out_dir, !tokenizer);
    if (tokenizer) {
        const std::vector<std::string> files = export_hf_tokenizer(*tokenizer, opt_.out_dir);
        std::string names;
        for (const std::string& f : files) names += (names.empty() ? "" : ", ") + f;
        log.message(cat("[Setup] tokenizer files written: ", names, " (from ", tokenizer->source(), ")"));
    }
    if (ranks) ranks->join();
    log.log_done(step, opt_.out_dir, std::chrono::duration<double>(Clock::now() - t_start).count());
    return 0;
}

}  // namespace qtrain
