// What every rank of a run shares, decided before any rank starts (docs/design.md, "The rank loop"):
// the validated options, the device, the model's source and config, the memory plan checked against
// the limits, the output tokenizer, how the ranks were launched and the communicators their models
// use. Made once by make_run_context for the CLI (Trainer) and the Python session alike.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/model_backends.h"
#include "comm/communicator.h"
#include "model/model_options.h"
#include "tokenizer/tokenizer.h"
#include "train/model_source.h"
#include "train/packing_options.h"
#include "train/plan_check.h"
#include "train/test_fault.h"
#include "train/train_options.h"

namespace qtrain {

// One process per rank (mpirun, torchrun, Slurm): how it was launched, for the log and the messages.
struct ProcessLaunch {
    std::string mode;          // "MPI mode", "torchrun mode", "Slurm mode"
    std::string ranks_source;  // "mpirun -np 4", "WORLD_SIZE=4", ...
    int local_rank = 0;        // the rank among this node's processes (its default GPU)
};

struct RunContext {
    TrainOptions options;        // validated; gpus resolved to the number of ranks
    std::string command_line;
    std::string device;          // "cpu" or "cuda"
    int world = 1;               // ranks of the run
    ModelSource source;
    ModelOptions model_options;  // device_index is set per rank
    PackingDecision packing;     // --document-masking / --loss-normalization, auto resolved on the train files
    CheckedPlan plan;
    std::shared_ptr<const Tokenizer> tokenizer;  // --tokenizer's, for rank 0's export (null: none)
    std::string launch;          // "threads mode" or "MPI mode", for the log
    std::string ranks_source;    // how the rank count was given: "--gpus=2", "mpirun -np 2"
    std::vector<int> gpu_ids;    // --gpu-ids (empty: rank_devices.h's default)
    std::optional<int> mpi_local_rank;
    ModelCommunicatorFactory model_communicator;  // empty: the model uses the host communicator
    std::optional<TestFault> test_fault;
    // the SIGINT/SIGTERM seen by this process (0: none); null: never (the Python session)
    const std::atomic<int>* stop_signal = nullptr;
    // rank 0's JSONL lines as they are written (Logger::set_listener); empty: none
    std::function<void(const std::string&)> log_listener;
    std::chrono::steady_clock::time_point t_start;
};

// Validates `options`, resolves the device, the model and the rank count (threads mode: --gpus;
// with `host`, one process per rank as `launch` says), loads the output tokenizer on rank 0 and checks
// the memory plan against the limits (throws when it does not fit). With --plan-only it stops there
// (the caller prints the plan). Otherwise it also checks that every output path is writable and
// makes the models' communicator factory (`model_communicator` when given: for tests and embedding).
// need_train_file=false: the Python session, which may give each step's tokens itself.
RunContext make_run_context(const TrainOptions& options, const std::string& command_line,
                            comm::Communicator* host = nullptr, const ProcessLaunch* launch = nullptr,
                            const ModelCommunicatorFactory& model_communicator = {}, bool need_train_file = true);

}  // namespace qtrain
