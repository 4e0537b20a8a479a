// A training run: data -> micro-batches -> IModel -> optimizer step, with evaluation, checkpoints,
// resume and the final HF export, on one rank or data parallel over several (threads of this process
// with --gpus=N, or one process per rank under mpirun, torchrun or Slurm). Device-agnostic: everything device-specific
// sits behind IModel (model_factory.h builds it). This class checks what can be checked before any
// rank starts (options, the memory plan, the output paths) and launches the ranks; each rank runs
// the same loop (rank_loop.h).
#pragma once

#include <string>

#include "comm/launch_env.h"
#include "train/model_factory.h"
#include "train/train_options.h"

namespace qtrain {

class Trainer {
public:
    explicit Trainer(TrainOptions options, std::string command_line = "");
    // Runs the whole job; returns the process exit code (0, or 130 after SIGINT/SIGTERM with a
    // checkpoint written). Throws qtrain::Error on bad input. Under mpirun (comm::detect_mpi_launch)
    // this process is one rank: its errors end the whole job (MPI_Abort) with a message naming it.
    int run();

    // The model communicator of each rank (model_factory.h) instead of the device's default
    // (model_communicator_factory): for embedding qtrain, and for tests of the hook.
    void set_model_communicator_factory(ModelCommunicatorFactory factory) { model_communicator_ = std::move(factory); }

private:
    // One process per rank: how it was launched, for the log and the messages.
    struct ProcessLaunch {
        std::string mode;          // "MPI mode", "torchrun mode", "Slurm mode"
        std::string ranks_source;  // "mpirun -np 4", "WORLD_SIZE=4", ...
        int local_rank = 0;        // the rank among this node's processes (its default GPU)
    };
    // Everything after the launch is known; `host` is this process's communicator when each rank is a
    // process (mpirun, torchrun, Slurm), null in threads mode (the ranks' communicators are made here then).
    int prepare_and_run(comm::Communicator* host, const ProcessLaunch* launch = nullptr);
    // torchrun / Slurm variables (comm/launch_env.h): this process is one rank, over TCP.
    int run_tcp_rank(const comm::LaunchEnv& env);

    TrainOptions opt_;
    std::string command_line_;
    ModelCommunicatorFactory model_communicator_;
};

}  // namespace qtrain
