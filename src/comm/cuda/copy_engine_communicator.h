// The copy-engine backend (the original design's --memcpy-all-gather path): the ranks are threads of
// one process, each with a CUDA device (several ranks may share one; distinct devices reach each other
// through peer access when the hardware allows it). Buffers are device memory; every collective is
// queued on the caller's stream (a cudaStream_t on the rank's device, passed as void*; null is the
// device's legacy default stream) and returns without waiting for the GPU.
//
// Data moves with cudaMemcpyAsync / cudaMemcpyPeerAsync, i.e. on the copy engines, leaving the SMs to
// the model; each rank pulls what it needs from its peers' buffers into its own, and never writes a
// peer's. Sums: the peers' blocks are copied into this communicator's staging buffer, then one kernel
// adds them to the rank's own block in rank order (comm/cuda/rank_order_sum_gpu.h), giving the bits
// of comm/rank_order_sum.h:
//   reduce_scatter: rank r copies block r of every peer's send, then sums into its recv.
//   all_reduce:     rank r sums share r of the elements (even_split) the same way into its recv, then
//                   copies the peers' summed shares from their recvs (reduce-scatter + all-gather,
//                   each rank moving about 2 (N-1)/N of the buffer).
//   reduce:         the root copies every peer's send into staging, then sums into its recv; the
//                   other ranks copy nothing (each non-root's data crosses once).
//   all_gather, broadcast: copies from the peers' (the root's) buffers.
//
// Ordering. The host threads meet in a ThreadWorld at every collective (its failure semantics: a rank
// that fails, returns or times out makes every other rank throw, never hang), and the streams are
// ordered with events, never with a host wait:
//   1. Each rank records `ready` on its stream, then meets the others (ThreadWorld::arrive, which also
//      hands every rank its peers' events and device). Its stream waits for every peer's `ready`
//      before it reads their buffers: a peer's data is read only once the work the peer queued
//      before the call has written it.
//   2. (all_reduce only) each rank records `summed` after its share's sum, meets again, and its
//      stream waits for the peers' `summed` before copying their shares.
//   3. Each rank records `done` after its last read of a peer's buffer, meets again (depart), and its
//      stream waits for every peer's `done`: the collective completes on a rank's stream only once
//      no peer reads its buffers any more, so the caller may overwrite its send (or recv) right
//      after the call in stream order. (A reduce waits only where data is read: the root for every
//      peer's `ready`, a non-root for the root's `done`.)
// Every wait is for an event recorded before the meeting that published it, so no stream ever
// waits for host work that has not happened yet (no deadlock, whatever the thread timing). A rank's
// events live as long as the world (ThreadWorld::keep_until_destroyed), not its communicator: after
// the last meeting a peer may still be queueing its wait on them while this rank has already returned.
//
// Staging: the communicator's own device memory (comm/cuda/staging_buffer.h): reserve() it outside
// of steps, or it grows on first use. Each collective's stream also waits for this rank's previous
// collective, so the staging is never reused before that one has finished with it, even on another
// stream.
//
// CUDA graphs: NOT supported. The host meets the other ranks at every call, which a graph replay
// would skip; a collective called while its stream is capturing throws (use the NCCL backend for
// captured steps).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/thread_world.h"

namespace qtrain::comm {

struct CopyEngineState;  // copy_engine_communicator.cpp

class CopyEngineCommunicator final : public Communicator {
public:
    // Rank `rank` of `world`, on CUDA device `device` (which must exist). Creates its events on that
    // device, which `world` keeps until it is destroyed; `world` must outlive it. Any thread may
    // construct it; its collectives may be called from any thread (one at a time), whichever device
    // that thread has current.
    CopyEngineCommunicator(ThreadWorld& world, int rank, int device);
    ~CopyEngineCommunicator() override;

    int rank() const override;
    int world() const override;
    std::string backend() const override { return "copy-engine"; }
    int device() const;
    void abort(const std::string& reason) override;  // fails the ThreadWorld (its peers throw)

    // Staging for the sums of up to `bytes` (see staging_bytes_for); waits for the device.
    void reserve(std::size_t bytes);
    std::size_t staging_bytes() const;
    // The staging an all-reduce of `all_reduce_count` elements and a reduce-scatter of
    // `reduce_scatter_count` elements per rank (of `dtype`) need on rank `rank` of `world`. A reduce of
    // `count` elements needs, at its root, what a reduce-scatter of `count` per rank does (the other
    // ranks need none): pass max(reduce_scatter_count, count).
    static std::size_t staging_bytes_for(std::size_t all_reduce_count, std::size_t reduce_scatter_count, DType dtype,
                                         int world, int rank);

protected:
    void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, void* stream) override;
    void do_reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, void* stream) override;
    void do_reduce(const void* send, void* recv, std::size_t count, DType dtype, int root, void* stream) override;
    void do_all_gather(const void* send, void* recv, std::size_t send_count, DType dtype, void* stream) override;
    void do_broadcast(void* buffer, std::size_t count, DType dtype, int root, void* stream) override;
    // A host meeting only (the ranks' streams are not synchronised).
    void do_barrier() override;
    bool uses_stream() const override { return true; }

private:
    std::unique_ptr<CopyEngineState> state_;
};

// Claims rank `rank` of `world` (one communicator per rank) for a communicator on `device`.
std::unique_ptr<CopyEngineCommunicator> make_copy_engine_communicator(ThreadWorld& world, int rank, int device);

}  // namespace qtrain::comm
