// Threads mode (--gpus=N without mpirun): the N ranks of a data-parallel run as threads of this
// process, each with its communicator of one ThreadWorld. Rank 0 runs on the calling thread (the
// one that owns stdout, the signal handlers and, on the GPU, the primary context's first device);
// ranks 1..N-1 on threads of their own, which live as long as the RankThreads, so a driver can run
// one command after another on all ranks (the training session: open, step, evaluate, ...).
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/thread_world.h"

namespace qtrain {

// How long a rank waits in one collective for the others before the world fails naming the ranks
// that did not arrive. Long, because some phases are rank 0's alone while the others wait for it:
// verifying the checkpoint to resume from and hashing a new one (minutes for a 100 GB checkpoint),
// the HF export. Failures do not wait for it: a rank that throws fails the world at once.
constexpr std::chrono::milliseconds kRankTimeout{std::chrono::hours(1)};

class RankThreads {
public:
    using RankFn = std::function<void(int rank, comm::Communicator& comm)>;
    explicit RankThreads(int world, std::chrono::milliseconds timeout = kRankTimeout);
    ~RankThreads();  // ends and joins the threads
    RankThreads(const RankThreads&) = delete;
    RankThreads& operator=(const RankThreads&) = delete;

    int world() const { return world_.world(); }
    // Runs fn on every rank at once (rank 0 on this thread) and returns when all have. A rank that
    // throws fails the world, so the others stop at their next collective (with an error naming it)
    // instead of waiting. Then the first failure is thrown, "rank R of N failed: <its error>" (a
    // qtrain::Error, or for rank 0's own non-qtrain exception a std::runtime_error, so an internal
    // error still reads as one); with one rank, its exception as it is. After a failure the world
    // stays failed: every later collective fails at once. `last`: the ranks make no calls after fn
    // (ThreadWorld::leave), so a rank still waiting for one that has returned fails at once.
    void run(const RankFn& fn, bool last = false);
    // Runs fn on every rank (its own thread) whatever the world's state, swallowing errors: for
    // releasing what each rank holds on the thread that made it.
    void run_quietly(const RankFn& fn);

private:
    void worker(int rank);
    void dispatch(const RankFn& fn, bool last, bool quiet);

    comm::ThreadWorld world_;
    std::vector<std::unique_ptr<comm::Communicator>> comms_;
    std::vector<std::thread> threads_;
    std::mutex mu_;
    std::condition_variable wake_, done_;
    const RankFn* job_ = nullptr;
    bool job_last_ = false, job_quiet_ = false, quit_ = false;
    uint64_t generation_ = 0;
    int pending_ = 0;
    std::vector<std::exception_ptr> errors_;
};

// Runs rank_fn as ranks 0..world-1 once and returns rank 0's result once every rank has returned
// (RankThreads::run with last = true: the failures as it says).
int run_rank_threads(int world, const std::function<int(comm::Communicator&)>& rank_fn,
                     std::chrono::milliseconds timeout = kRankTimeout);

}  // namespace qtrain
