// Threads mode (--gpus=N on the CPU model): the other ranks of a data-parallel run as threads of this
// process. Rank 0 is the trainer itself (it logs, evaluates, checkpoints and exports); ranks 1..N-1
// train the same steps on their share of each micro-batch group (DataLoader::set_rank) and meet rank 0
// in the model's collectives and once per step in agree_after_step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/thread_world.h"

namespace qtrain {

// What every rank must decide alike after a step: whether to stop (rank 0 saw a signal) and how many
// targets the step had over all ranks (a step without any is skipped, not an error).
struct StepAgreement {
    bool stop = false;
    int64_t valid_targets = 0;
};
StepAgreement agree_after_step(comm::Communicator& comm, bool stop_requested, int64_t valid_targets);

class RankThreads {
public:
    // Starts ranks 1..world-1 of `world`, each running fn with its communicator. A rank that throws
    // aborts the world, so rank 0's next collective fails with an error naming it.
    RankThreads(comm::ThreadWorld& world, const std::function<void(comm::Communicator&)>& fn);
    // Rank 0 gave up (an exception): the others stop at their next collective instead of waiting.
    ~RankThreads();
    RankThreads(const RankThreads&) = delete;
    RankThreads& operator=(const RankThreads&) = delete;

    comm::Communicator& rank0() { return *rank0_; }
    // Rank 0 is done: wait for the others (they finish the same steps) and rethrow a failure of theirs.
    void join();

private:
    comm::ThreadWorld& world_;
    std::unique_ptr<comm::Communicator> rank0_;
    std::vector<std::thread> threads_;
    bool joined_ = false;
};

}  // namespace qtrain
