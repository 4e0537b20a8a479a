// The in-process backend: rank `rank` of a ThreadWorld whose ranks are threads of this process. Buffers
// are host memory; each collective completes before returning (stream must be null).
//
// Determinism: sums are computed by sum_in_rank_order (rank order 0..N-1, fp32, one rounding) over
// the peers' buffers read directly, so the bits do not depend on thread timing or on which rank
// computes which share (each rank sums a contiguous share of the elements and writes it to every
// rank's recv; for a reduce, to the root's only).
//
// Each rank's buffers are its own, as they would be in separate processes: a buffer shared by two
// ranks (one output array for all) would be written by several ranks at once.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/thread_world.h"

namespace qtrain::comm {

// One per rank, used by one thread at a time; `world` must outlive it. Asking twice for a rank's
// communicator is an error (two callers would meet as one rank).
std::unique_ptr<Communicator> make_thread_communicator(ThreadWorld& world, int rank);

}  // namespace qtrain::comm
