// A training run: data -> micro-batches -> IModel -> optimizer step, with evaluation, checkpoints,
// resume and the final HF export, on one rank or data parallel over several (threads of this process
// with --gpus=N, or one process per rank under mpirun, torchrun or Slurm). Device-agnostic: everything device-specific
// sits behind IModel (backends/model_backends.h builds it). This class finds how the ranks were
// launched, checks what can be checked before any rank starts (make_run_context: options, the memory
// plan, the output paths), installs the stop signals and drives a TrainingSession (session.h) to the
// end, the loop the Python package drives step by step.
#pragma once

#include <string>

#include "comm/launch_env.h"
#include "backends/model_backends.h"
#include "train/run_context.h"
#include "train/train_options.h"

namespace qtrain {

class Trainer {
public:
    explicit Trainer(TrainOptions options, std::string command_line = "");
    // Runs the whole job; returns the process exit code (0, or 130 after SIGINT/SIGTERM with a
    // checkpoint written). Throws qtrain::Error on bad input. Under mpirun (comm::detect_mpi_launch)
    // this process is one rank: its errors end the whole job (MPI_Abort) with a message naming it.
    int run();

    // The model communicator of each rank (backends/model_backends.h) instead of the device's default
    // (model_communicator_factory): for embedding qtrain, and for tests of the hook.
    void set_model_communicator_factory(ModelCommunicatorFactory factory) { model_communicator_ = std::move(factory); }

private:
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
