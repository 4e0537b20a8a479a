#include "train/trainer.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "comm/mpi_launch.h"
#include "core/error.h"
#include "comm/launch_env.h"
#include "comm/tcp/tcp_communicator.h"
#include "train/checkpoint_export.h"
#include "train/plan_check.h"
#include "train/rendezvous_bound.h"
#include "train/run_context.h"
#include "train/session.h"
#include "train/stop_signals.h"

#if QTRAIN_HAVE_MPI
#include "comm/mpi/mpi_communicator.h"
#endif

namespace qtrain {

namespace {

// The rendezvous's bound and its lines on stderr (the only output every rank has: the others' stdout
// is /dev/null), every 10 s; QTRAIN_RENDEZVOUS_PROGRESS_SECONDS changes that interval (tests).
comm::TcpOptions rendezvous_options(const TrainOptions& o) {
    comm::TcpOptions t;
    const comm::WaitBound bound = rendezvous_bound(o);
    t.connect_timeout = bound.duration();
    t.timeout_setting = bound.setting;
    t.progress = [](const std::string& line) {
        std::fprintf(stderr, "%s\n", line.c_str());
        std::fflush(stderr);
    };
    if (const char* s = std::getenv("QTRAIN_RENDEZVOUS_PROGRESS_SECONDS"); s && *s) {
        char* end = nullptr;
        const double seconds = std::strtod(s, &end);
        QT_CHECK(end && *end == '\0' && seconds > 0 && seconds < 1e6, "QTRAIN_RENDEZVOUS_PROGRESS_SECONDS='", s,
                 "' is not a number of seconds > 0");
        t.progress_interval = std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0));
    }
    return t;
}

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
    // The options are parsed (each value checked by the CLI) but not yet validated: that runs inside
    // the rank, after the rendezvous, so that a bad flag on one rank fails every rank naming it.
    std::unique_ptr<comm::Communicator> host = comm::make_tcp_communicator(env, rendezvous_options(opt_));
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
    const bool mpirun = launch && launch->mode == "MPI mode";
    StopSignals signals(mpirun ? host->rank() : -1, mpirun ? host->world() : 1);
    ctx.stop_signal = StopSignals::flag();
    return TrainingSession(std::move(ctx), host).run();
}

}  // namespace qtrain
