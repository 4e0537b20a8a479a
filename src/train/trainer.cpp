#include "train/trainer.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <optional>

#include "comm/mpi_launch.h"
#include "core/error.h"
#include "comm/launch_env.h"
#include "comm/tcp/tcp_communicator.h"
#include "train/checkpoint_export.h"
#include "train/plan_check.h"
#include "train/run_context.h"
#include "train/session.h"

#if QTRAIN_HAVE_MPI
#include "comm/mpi/mpi_communicator.h"
#endif

namespace qtrain {

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

int Trainer::prepare_and_run(comm::Communicator* host, const ProcessLaunch* launch) {
    RunContext ctx = make_run_context(opt_, command_line_, host, launch, model_communicator_);
    if (ctx.options.plan_only) {
        print_plan_only(ctx.plan, ctx.source.config, ctx.model_options, ctx.device);
        return 0;
    }
    StopSignals signals;
    ctx.stop_signal = &g_stop_signal;
    return TrainingSession(std::move(ctx), host).run();
}

}  // namespace qtrain
