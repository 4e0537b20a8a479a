// One rank of a training run: the same code on every rank, whether the run has one rank, N threads
// of this process (rank_threads.h) or N processes under mpirun (docs/design.md, "The rank loop").
// Each rank builds its own model and data loader (its block of every micro-batch group,
// DataLoader::set_rank), trains the same steps, meets the others in the model's collectives (over
// the model communicator) and, over the host communicator, once per step (step_agreement.h), in the
// split evaluation (evaluation.h) and in collective checkpoints (checkpointer.h). Rank 0 also decides
// how the run starts (run_start.h), prints [T]/[V], writes the JSONL log, and writes the HF export
// and the tokenizer files.
#pragma once

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/model_options.h"
#include "tokenizer/tokenizer.h"
#include "train/model_factory.h"
#include "train/plan_check.h"
#include "train/test_fault.h"
#include "train/train_options.h"

namespace qtrain {

// What every rank of a run shares, fixed before the ranks start (trainer.cpp).
struct RunContext {
    TrainOptions options;        // validated; gpus resolved to the number of ranks
    std::string command_line;
    std::string device;          // "cpu" or "cuda"
    ModelSource source;
    ModelOptions model_options;  // device_index is set per rank
    CheckedPlan plan;
    const std::optional<Tokenizer>* tokenizer = nullptr;  // --tokenizer's, for rank 0's export
    std::string launch;          // "threads mode" or "MPI mode", for the log
    std::string ranks_source;    // how the rank count was given: "--gpus=2", "mpirun -np 2"
    std::vector<int> gpu_ids;    // --gpu-ids (empty: rank_devices.h's default)
    std::optional<int> mpi_local_rank;
    ModelCommunicatorFactory model_communicator;  // empty: the model uses the host communicator
    std::optional<TestFault> test_fault;
    const std::atomic<int>* stop_signal = nullptr;  // the SIGINT/SIGTERM seen by this process (0: none)
    std::chrono::steady_clock::time_point t_start;
};

// Runs rank host.rank() of host.world(); returns the exit code (0, or 130 after a signal with a
// checkpoint written). Throws on rank 0 for every error it reports; the other ranks return instead
// where rank 0 reports the stop (a broken step, a failed export), and throw for their own failures.
int run_rank(const RunContext& ctx, comm::Communicator& host);

}  // namespace qtrain
