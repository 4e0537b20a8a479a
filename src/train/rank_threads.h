// Threads mode (--gpus=N without mpirun): the N ranks of a data-parallel run as threads of this
// process, each with its communicator of one ThreadWorld. Rank 0 runs on the calling thread (the
// one that owns stdout, the signal handlers and, on the GPU, the primary context's first device);
// ranks 1..N-1 on threads of their own. Every rank runs the same function (rank_loop.h).
#pragma once

#include <chrono>
#include <functional>

#include "comm/communicator.h"

namespace qtrain {

// How long a rank waits in one collective for the others before the world fails naming the ranks
// that did not arrive. Long, because some phases are rank 0's alone while the others wait for it:
// verifying the checkpoint to resume from and hashing a new one (minutes for a 100 GB checkpoint),
// the HF export. Failures do not wait for it: a rank that throws fails the world at once.
constexpr std::chrono::milliseconds kRankTimeout{std::chrono::hours(1)};

// Runs rank_fn as ranks 0..world-1 and returns rank 0's result once every rank has returned. A rank
// that throws fails the world, so the others stop at their next collective (with an error naming it)
// instead of waiting. Then the first failure is thrown, "rank R of N failed: <its error>" (a
// qtrain::Error, or for rank 0's own non-qtrain exception a std::runtime_error, so an internal error
// still reads as one); with one rank, its exception as it is.
int run_rank_threads(int world, const std::function<int(comm::Communicator&)>& rank_fn,
                     std::chrono::milliseconds timeout = kRankTimeout);

}  // namespace qtrain
