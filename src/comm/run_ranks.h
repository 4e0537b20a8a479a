// Threads mode's launcher: runs one function as N ranks on N threads of this process, each with its
// rank's communicator of one ThreadWorld, and turns any rank's failure into one error for the caller.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "comm/communicator.h"
#include "comm/thread_world.h"

namespace qtrain::comm {

// Runs fn on world.world() threads, thread r with rank r's communicator, and joins them all. A rank
// that throws fails the world (its peers stop with an error naming it instead of waiting); a rank that
// returns leaves it (a peer still waiting for it fails at once). When anything failed, throws one
// qtrain::Error: the first failure, naming its rank (or, for a timeout, the ranks that did not arrive).
// A rank that blocks forever outside the communicator cannot be interrupted (threads cannot be
// killed): its peers stop with the timeout error, but the join waits for it.
void run_ranks(ThreadWorld& world, const RankFunction& fn);

// The same with another backend's communicators over `world` (the copy-engine backend, say):
// make(world, r) creates rank r's, for every rank on this thread before any rank runs, so a failure
// there happens before any rank waits for another.
using MakeRankCommunicator = std::function<std::unique_ptr<Communicator>(ThreadWorld& world, int rank)>;
void run_ranks(ThreadWorld& world, const MakeRankCommunicator& make, const RankFunction& fn);

// The same on a fresh ThreadWorld of `world` ranks.
void run_ranks(int world, const RankFunction& fn, std::chrono::milliseconds timeout = ThreadWorld::kDefaultTimeout);

}  // namespace qtrain::comm
