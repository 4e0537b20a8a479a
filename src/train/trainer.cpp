#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"
#include "core/files.h"
#include "model/imodel.h"
#include "tokenizer/hf_tokenizer_export.h"
#include "train/checkpointer.h"
#include "train/data_loader.h"
#include "train/logger.h"
#include "train/lr_schedule.h"
#include "train/model_factory.h"
#include "train/output_tokenizer.h"
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

// The first of a ladder of memory-saving flag sets (each saving more than the one before, at more
// recomputation) with which the plan fits `limit`; empty when none does or the backend refuses them.
std::string flags_that_fit(const ModelConfig& cfg, ModelOptions m, const std::string& device, uint64_t limit) {
    struct Step {
        const char* flags;
        void (*apply)(ModelOptions&);
    };
    static const Step ladder[] = {
        {"--recompute-swiglu", [](ModelOptions& o) { o.recompute_swiglu = true; }},
        {"--recompute-ffn", [](ModelOptions& o) { o.recompute_ffn = o.recompute_swiglu = true; }},
        {"--recompute-ffn --recompute-norm", [](ModelOptions& o) { o.recompute_norm = true; }},
        {"--recompute-ffn --recompute-norm --recompute-att",
         [](ModelOptions& o) { o.recompute_att = o.recompute_qkv = true; }},
        {"--recompute-block", [](ModelOptions& o) { o.recompute_block = true; }},
        {"--recompute-block --offload-opt-m --offload-opt-v",
         [](ModelOptions& o) { o.offload_opt_m = o.offload_opt_v = true; }},
        {"--recompute-block --offload-opt-m --offload-opt-v --offload-master",
         [](ModelOptions& o) { o.offload_master = true; }},
        {"--recompute-block --offload-opt-m --offload-opt-v --offload-master --offload-gradients",
         [](ModelOptions& o) { o.offload_gradients = true; }},
        {"--recompute-block --offload-opt-m --offload-opt-v --offload-master --offload-gradients --shard-weights",
         [](ModelOptions& o) { o.shard_weights = true; }},
    };
    // each rung first as it is, then with the LM head in 8 chunks (cheap: it only bounds the logits)
    auto fits = [&](const ModelOptions& t) {
        try {
            return plan_model(cfg, t, device).total_device() <= limit;
        } catch (const Error&) {
            return false;  // this backend does not take these flags
        }
    };
    const int more_chunks = std::max(m.lmhead_chunks, 8);
    const std::string chunk_flag = cat("--lmhead-chunks=", more_chunks);
    ModelOptions t = m;
    if (more_chunks != m.lmhead_chunks) {
        t.lmhead_chunks = more_chunks;
        if (fits(t)) return chunk_flag;
        t.lmhead_chunks = m.lmhead_chunks;
    }
    for (const Step& s : ladder) {
        s.apply(t);
        if (fits(t)) return s.flags;
        if (more_chunks != m.lmhead_chunks) {
            ModelOptions c = t;
            c.lmhead_chunks = more_chunks;
            if (fits(c)) return cat(s.flags, " ", chunk_flag);
        }
    }
    return {};
}

// The largest --batch-size (at most `cap`) whose plan fits `limit` (and `host_limit` when set) with
// these flags, or 0. The streamed configurations pay their PCIe traffic per micro-batch, so the
// largest micro-batch that fits is usually the fastest: --plan-only says what it is. Sizes are
// multiples of --attn-bwd-chunks (which must divide the batch); a plan grows with the batch, so a
// binary search over those finds it.
int largest_batch_that_fits(const ModelConfig& cfg, ModelOptions m, const std::string& device, uint64_t limit,
                            uint64_t host_limit, int cap) {
    const int step = std::max(1, m.attn_bwd_chunks);
    auto fits = [&](int k) {
        m.batch_size = k * step;
        try {
            const MemoryPlan p = plan_model(cfg, m, device);
            return p.total_device() <= limit && (!host_limit || p.total_pinned() <= host_limit);
        } catch (const Error&) {
            return false;
        }
    };
    int lo = 0, hi = cap / step;  // fits(lo) holds (0: nothing), the answer is in [lo, hi]
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (fits(mid)) lo = mid;
        else hi = mid - 1;
    }
    return lo * step;
}

// The first of a ladder of host-memory-saving precision flags (cumulative) with which the pinned
// plan fits `host_limit` (and the device plan still fits `limit`); empty when none does. Rungs that
// change nothing for these options (say, moments already bf16) are skipped.
std::string pinned_flags_that_fit(const ModelConfig& cfg, ModelOptions t, const std::string& device, uint64_t limit,
                                  uint64_t host_limit) {
    auto fits = [&](const ModelOptions& o) {
        try {
            const MemoryPlan p = plan_model(cfg, o, device);
            return p.total_pinned() <= host_limit && (!limit || p.total_device() <= limit);
        } catch (const Error&) {
            return false;
        }
    };
    std::string flags;
    auto rung = [&](bool applies, const char* f, auto apply) {
        if (!applies) return false;
        apply(t);
        flags += flags.empty() ? f : cat(" ", f);
        return fits(t);
    };
    if (rung(t.offload_gradients && t.param_grad_dtype == DType::F32, "--param-grad-dtype=bf16",
             [](ModelOptions& o) { o.param_grad_dtype = DType::BF16; }))
        return flags;
    if (rung((t.offload_opt_m && t.opt_m_dtype == DType::F32) || (t.offload_opt_v && t.opt_v_dtype == DType::F32),
             "--opt-m-dtype=bf16 --opt-v-dtype=bf16", [](ModelOptions& o) { o.opt_m_dtype = o.opt_v_dtype = DType::BF16; }))
        return flags;
    if (rung(t.offload_master && t.master_dtype == DType::F32 && t.model_dtype == DType::BF16,
             "--master-dtype=bf16 without --offload-master", [](ModelOptions& o) {
                 o.master_dtype = DType::BF16;
                 o.offload_master = false;
             }))
        return flags;
    return {};
}

// What a training run may pin: this machine's RAM — or its container's memory limit (cgroup v2 or
// v1) when lower — less 5% (at least 4 GiB) for everything else.
uint64_t usable_host_memory() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return 0;  // unknown: no check
    uint64_t ram = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
    for (const char* limit_file : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
        std::ifstream in(limit_file);
        uint64_t limit = 0;
        if (in >> limit && limit > 0) ram = std::min(ram, limit);  // "max" (no limit) does not parse
    }
    const uint64_t keep = std::max<uint64_t>(4ull << 30, ram / 20);
    return ram > keep ? ram - keep : 0;
}

}  // namespace

Trainer::Trainer(TrainOptions options, std::string command_line)
    : opt_(std::move(options)), command_line_(std::move(command_line)) {}

int Trainer::run() {
    const auto t_start = Clock::now();
    opt_.validate();
    const std::string device = resolve_device(opt_.device, !opt_.plan_only);
    const ModelSource source = resolve_model_source(opt_);
    const ModelConfig& cfg = source.config;
    // loaded now (a second or so for Qwen's 7 MB tokenizer.json), though only written at the end
    const std::optional<Tokenizer> tokenizer =
        opt_.plan_only ? std::nullopt : load_output_tokenizer(opt_.tokenizer, cfg.vocab_size);
    const ModelOptions mopt = opt_.model_options(device);
    const uint64_t limit = mopt.memory_limit;

    const MemoryPlan plan = plan_model(cfg, mopt, device);
    if (limit && plan.total_device() > limit) {
        Logger("/dev/null", true).log_memory(plan, limit);  // show where the memory goes, then fail
        const std::string fit = flags_that_fit(cfg, mopt, device, limit);
        const int fitting_batch = largest_batch_that_fits(cfg, mopt, device, limit, 0, mopt.batch_size);
        const std::string smaller = fitting_batch > 0
                                        ? cat("with the current flags --batch-size=", fitting_batch, " fits")
                                        : std::string("with the current flags not even --batch-size=1 fits");
        throw_error(cat("the memory plan needs ", human_bytes(plan.total_device()), " but --memory-limit is ",
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

    // Resume state, if any (before the log file is opened, so a fresh run truncates it).
    std::optional<std::string> resume_dir;
    if (opt_.continue_from_checkpoint) resume_dir = find_latest_checkpoint(opt_.checkpoint_dir);

    Logger log(opt_.log_path(), resume_dir.has_value());
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

    int start_step = 0;
    if (resume_dir) {
        CheckpointState st = read_checkpoint_state(*resume_dir);
        model->load_checkpoint(*resume_dir);
        train_data.set_state(st.train_data);
        start_step = st.step;
        log.log_resume(start_step, *resume_dir);
    } else {
        if (opt_.continue_from_checkpoint)
            log.message(fmt::format("[Resume] no checkpoint in '{}', starting from step 0", opt_.checkpoint_dir));
        if (opt_.from_scratch) {
            model->init_random(opt_.seed);
        } else {
            QT_CHECK(source.directory, "--model: no weights to load for ", source.description, " (add --from-scratch)");
            log.message("Loading weights from " + *source.directory);
            model->load_hf(*source.directory);
        }
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

    auto save_checkpoint = [&](int completed_steps) {
        auto t0 = Clock::now();
        CheckpointState st;
        st.step = completed_steps;
        st.train_data = train_data.state();
        st.options_json = opt_.to_json();
        st.config_json = model_config_to_json(cfg);
        st.device = device;
        std::string dir = write_checkpoint(opt_.checkpoint_dir, *model, st);
        log.log_checkpoint(completed_steps, dir, ms_since(t0));
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

    std::vector<int32_t> inputs, targets;
    const float grad_scale = 1.0f / static_cast<float>(opt_.grad_accumulation);
    const int64_t step_tokens = static_cast<int64_t>(opt_.batch_size) * opt_.seq_len * opt_.grad_accumulation;
    int step = start_step;
    bool evaluated_last = false;
    for (; step < opt_.steps; ++step) {
        auto t0 = Clock::now();
        for (int micro = 0; micro < opt_.grad_accumulation; ++micro) {
            train_data.next_batch(inputs, targets);
            model->forward_backward(Batch{inputs.data(), targets.data(), opt_.batch_size, opt_.seq_len}, grad_scale);
        }
        const float lr = schedule.at(step);
        OptimizerParams p{lr, opt_.beta_1, opt_.beta_2, opt_.adam_epsilon, opt_.weight_decay, opt_.grad_clip, step + 1};
        const StepStats stats = model->optimizer_step(p);
        log.log_step(step, train_data.epoch_progress(), step_tokens, ms_since(t0), stats.grad_norm, stats.loss, lr);
        if (std::string notes = model->performance_notes(); !notes.empty()) log.message(notes);
        QT_CHECK(std::isfinite(stats.loss) && std::isfinite(stats.grad_norm), "training diverged at step ", step,
                 ": loss ", stats.loss, ", grad norm ", stats.grad_norm,
                 " (try a lower --learning-rate or --grad-clip; resume from the last checkpoint with --continue)");

        const int completed = step + 1;
        evaluated_last = false;
        if (opt_.eval_every_n_steps > 0 && completed % opt_.eval_every_n_steps == 0) {
            run_eval(completed);
            evaluated_last = true;
        }
        if (opt_.ckpt_interval > 0 && completed % opt_.ckpt_interval == 0) save_checkpoint(completed);
        if (int sig = g_stop_signal.load()) {
            log.message(fmt::format("\nStopping on signal {} after step {}", sig, step));
            if (!(opt_.ckpt_interval > 0 && completed % opt_.ckpt_interval == 0) && !opt_.checkpoint_dir.empty())
                save_checkpoint(completed);
            return 130;
        }
    }
    if (!evaluated_last) run_eval(step);

    fs::create_directories(opt_.out_dir);
    t_setup = Clock::now();
    model->save_hf(opt_.out_dir);
    log.message(fmt::format("[Setup] model exported in {:.1f} s", seconds_since(t_setup)));
    if (source.directory) copy_model_dir_files(*source.directory, opt_.out_dir, !tokenizer);
    if (tokenizer) {
        const std::vector<std::string> files = export_hf_tokenizer(*tokenizer, opt_.out_dir);
        std::string names;
        for (const std::string& f : files) names += (names.empty() ? "" : ", ") + f;
        log.message(cat("[Setup] tokenizer files written: ", names, " (from ", tokenizer->source(), ")"));
    }
    log.log_done(step, opt_.out_dir, std::chrono::duration<double>(Clock::now() - t_start).count());
    return 0;
}

}  // namespace qtrain
