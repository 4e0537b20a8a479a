#include "train/trainer.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "comm/mpi_launch.h"
#include "core/error.h"
#include "train/output_tokenizer.h"
#include "train/plan_check.h"
#include "comm/launch_env.h"
#include "comm/tcp/tcp_communicator.h"
#include "train/checkpoint_export.h"
#include "train/rank_devices.h"
#include "train/rank_loop.h"
#include "train/rank_threads.h"
#include "train/run_guard.h"
#include "train/test_fault.h"

#if QTRAIN_HAVE_MPI
#include "comm/mpi/mpi_communicator.h"
#endif

namespace qtrain {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// SIGINT/SIGTERM finish the current step on every rank (they agree on it, step_agreement.h) and
// write a checkpoint; the handlers are this process's while it trains.
struct StopSignals {
    using Handler = void (*)(int);
    Handler old_int, old_term;
    StopSignals() {
        g_stop_signal.store(0);
        old_int = std::signal(SIGINT, on_stop_signal);
        old_term = std::signal(SIGTERM, on_stop_signal);
    }
    ~StopSignals() {
        std::signal(SIGINT, old_int);
        std::signal(SIGTERM, old_term);
    }
};

}  // namespace

Trainer::Trainer(TrainOptions options, std::string command_line)
    : opt_(std::move(options)), command_line_(std::move(command_line)) {}

int Trainer::run() {
    if (!opt_.export_checkpoint.empty()) {
        opt_.validate();
        return export_checkpoint(opt_);
    }
    const std::optional<comm::MpiLaunch> mpi = comm::detect_mpi_launch();
    if (!mpi) {
        if (const std::optional<comm::LaunchEnv> env = comm::detect_launch_env()) return run_tcp_rank(*env);
        return prepare_and_run(nullptr);
    }
#if QTRAIN_HAVE_MPI
    // Under mpirun only rank 0 speaks: the others' stdout is quiet; their errors still reach stderr,
    // named by rank (MpiCommunicator::abort).
    if (mpi->rank != 0) {
        QT_CHECK(std::freopen("/dev/null", "w", stdout), "cannot silence the stdout of rank ", mpi->rank);
    }
    int code = 0;
    // Everything runs inside the rank, so that any error, even a bad flag, ends every process of the
    // job with a message naming this rank instead of leaving the others waiting.
    const ProcessLaunch launch{"MPI mode", cat("mpirun -np ", mpi->world), mpi->local_rank};
    comm::run_mpi_rank([&](comm::Communicator& host) { code = prepare_and_run(&host, &launch); });
    return code;
#else
    throw_error(cat("train was started by mpirun (OMPI_COMM_WORLD_SIZE=", mpi->world,
                    ") but this build has no MPI support: install OpenMPI (scripts/setup.sh) and rebuild, or run "
                    "without mpirun and --gpus=", mpi->world, " for threads mode"));
#endif
}

int Trainer::run_tcp_rank(const comm::LaunchEnv& env) {
    // Only rank 0 speaks: the others' stdout is quiet; their errors still reach stderr, named by rank.
    if (env.rank != 0) QT_CHECK(std::freopen("/dev/null", "w", stdout), "cannot silence the stdout of rank ", env.rank);
    std::unique_ptr<comm::Communicator> host = comm::make_tcp_communicator(env);
    const ProcessLaunch launch{env.source == "slurm" ? "Slurm mode" : "torchrun mode",
                               cat(env.source == "slurm" ? "SLURM_NTASKS=" : "WORLD_SIZE=", env.world), env.local_rank};
    try {
        return prepare_and_run(host.get(), &launch);
    } catch (const std::exception& e) {
        // every other rank's next collective fails naming this one, instead of waiting for it
        host->abort(e.what());
        throw_error(cat("rank ", env.rank, " of ", env.world, " failed: ", e.what()));
    }
}

int Trainer::prepare_and_run(comm::Communicator* mpi_host, const ProcessLaunch* launch) {
    RunContext ctx;
    ctx.t_start = std::chrono::steady_clock::now();
    ctx.command_line = command_line_;
    TrainOptions& o = ctx.options;
    o = opt_;
    o.validate();
    // the number of ranks: --gpus threads, or mpirun's processes (then --gpus says nothing new)
    int world = std::max(1, o.gpus);
    if (mpi_host) {
        world = mpi_host->world();
        const bool mpirun = launch->mode == "MPI mode";
        QT_CHECK(o.gpus == 1 || o.gpus == world, "--gpus=", o.gpus, " but ", mpirun ? "mpirun" : launch->mode, " started ",
                 world, " processes (", mpirun ? cat("-np ", world) : launch->ranks_source, "): each process is one rank; "
                 "give --gpus=", world, " or leave --gpus out");
        o.gpus = world;  // recorded resolved, so a checkpoint's options say how many ranks wrote it
        ctx.launch = launch->mode;
        ctx.ranks_source = launch->ranks_source;
        ctx.mpi_local_rank = launch->local_rank;
    } else {
        ctx.launch = "threads mode";
        ctx.ranks_source = cat("--gpus=", o.gpus);
    }
    if (!o.gpu_ids.empty()) {
        ctx.gpu_ids = parse_gpu_ids(o.gpu_ids);
        check_gpu_ids_count(ctx.gpu_ids, world, ctx.ranks_source);
    }

    std::string& device = ctx.device;
    device = resolve_device(o.device, !o.plan_only);
    // a plan is made for the machine that will train, so on a machine without a GPU --plan-only
    // still plans for the GPU unless told --device=cpu
    const bool planning_for_gpu = o.plan_only && o.device == "auto" && device == "cpu" && cuda_backend_built();
    if (planning_for_gpu) device = "cuda";
    QT_CHECK(o.gpu_ids.empty() || device != "cpu", "--gpu-ids is not supported on --device=cpu (it places ranks on "
             "CUDA devices; the CPU ranks are threads or processes of this machine): leave it out");
    ctx.source = resolve_model_source(o);
    const ModelConfig& cfg = ctx.source.config;
    QT_CHECK(o.seq_len <= cfg.max_position_embeddings, "--seq-len=", o.seq_len,
             " is longer than the model's max_position_embeddings (", cfg.max_position_embeddings, ", ",
             ctx.source.description, "): positions beyond it were never trained; use --seq-len<=",
             cfg.max_position_embeddings, " (or raise max_position_embeddings in the model's config.json if you mean to "
             "extend the context)");
    // loaded now (a second or so for Qwen's 7 MB tokenizer.json), though only written at the end, by rank 0
    const bool lead = !mpi_host || mpi_host->rank() == 0;
    const std::optional<Tokenizer> tokenizer =
        o.plan_only || !lead ? std::nullopt : load_output_tokenizer(o.tokenizer, cfg.vocab_size);
    ctx.tokenizer = &tokenizer;
    ctx.model_options = o.model_options(device);
    if (planning_for_gpu)
        std::printf("note: no GPU here; --plan-only plans for the GPU (--device=cuda). --device=cpu plans the CPU "
                    "reference model instead\n\n");
    ctx.plan = check_memory_plan(o, cfg, ctx.model_options, device, world);
    if (o.plan_only) {
        print_plan_only(ctx.plan, cfg, ctx.model_options, device);
        return 0;
    }

    // Everything this run will write is checked before the model takes memory and time.
    probe_writable_dir(o.out_dir, "--out-dir");
    probe_writable_dir(fs::path(o.log_path()).parent_path().string(), "--log-file");
    probe_writable_dir(o.checkpoint_dir, "--checkpoint-dir");

    if (model_communicator_) {
        ctx.model_communicator = model_communicator_;
    } else {
        std::vector<int> devices;  // each rank's GPU (threads mode: all in this process)
        for (int r = 0; r < world; ++r) devices.push_back(rank_device_index(ctx.gpu_ids, r, ctx.mpi_local_rank));
        ctx.model_communicator = model_communicator_factory(device, ctx.model_options, world, devices, mpi_host);
    }
    ctx.test_fault = read_test_fault();
    StopSignals signals;
    ctx.stop_signal = &g_stop_signal;
    if (mpi_host) return run_rank(ctx, *mpi_host);
    return run_rank_threads(world, [&ctx](comm::Communicator& host) { return run_rank(ctx, host); });
}

}  // namespace qtrain
