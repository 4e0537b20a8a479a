// The NCCL backend: one rank per GPU, the ranks threads of one process (NcclThreadsWorld) or processes
// (mpirun: rank 0 makes the id with nccl_unique_id() and broadcasts its bytes). Buffers are device
// memory; every collective is queued on the caller's stream (a cudaStream_t on the rank's device,
// passed as void*) and returns without waiting for the GPU. Built when CMake finds NCCL
// (QTRAIN_HAVE_NCCL); this header needs no NCCL headers.
//
// Deterministic sums: NCCL's own reductions (rings, trees, NVLS) group the additions as their
// algorithm goes, not in rank order, so the sums move raw blocks with NCCL and add them with the
// rank-order kernel (comm/cuda/rank_order_sum_gpu.h), giving the bits of comm/rank_order_sum.h:
//   reduce_scatter: grouped ncclSend/ncclRecv (rank r receives block r of every peer's send into its
//                   staging), then the kernel sums them with its own block into recv.
//   all_reduce:     the same over padded blocks of ceil(count / N) elements (comm/block_layout.h),
//                   then ncclAllGather of the summed blocks: in place in recv when N divides count,
//                   else in staging, whose first `count` elements are copied to recv.
//   reduce:         grouped ncclSend (each non-root's send to the root) / ncclRecv (the root, into
//                   staging), then the kernel at the root.
//   all_gather = ncclAllGather, broadcast = ncclBroadcast (bytes, exact by nature).
//   barrier:        a one-element ncclAllReduce on an internal stream, then that stream's sync.
// At world 1 every collective is a copy, or nothing in place.
//
// CUDA graphs: supported. The collectives make no host synchronisation and no host meeting, and
// NCCL's calls are capturable; the staging must be big enough before capture (reserve(), see
// comm/cuda/staging_buffer.h), since growing it would allocate.
//
// Streams: the staging is reused in stream order; collectives of one communicator queued on several
// streams must be ordered by the caller (as NCCL's own calls on one communicator must be issued in
// the same order on every rank).
//
// Failures: every NCCL call is checked (the error names the collective, the rank and device, and
// NCCL's message). Like MPI's, a rank that fails or never calls leaves the others waiting inside NCCL
// on the GPU (the trainer's --comm-timeout watchdog ends that); NcclThreadsWorld checks the devices
// before any rank starts, and the destructor aborts the communicator (ncclCommAbort) when it runs
// during an exception.
//
// Creation within a bound (NcclInitWait): ncclCommInitRank waits forever for a rank that never calls
// it. NCCL's way out is a nonblocking communicator (config.blocking = 0: ncclCommInitRankConfig returns
// at once, ncclCommGetAsyncError says when it is done, ncclCommAbort cancels it). But blocking is a
// property of the communicator for life, and on a nonblocking one every later collective may return
// ncclInProgress before it is even queued on the stream (NCCL 2.28 queues each group from a thread of
// its own), which the sums here (a kernel queued right after the NCCL calls) and CUDA graph capture
// cannot have. So, with a bound, each rank first joins a nonblocking *probe* communicator on a second
// id, polled until it is complete or the bound passes (then aborted, and an error names this rank, its
// device, the bound and the flag that set it); only then the real, blocking one, which every rank
// reaches at once now. The probe is destroyed once the real one exists (earlier could cut a peer that
// is still finishing its probe). The cost is a second communicator creation (NCCL 2.28 connects the
// peers lazily, at the first collective, so creation is mostly the bootstrap).
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/wait_bound.h"

namespace qtrain::comm {

// An ncclUniqueId as plain bytes (NCCL_UNIQUE_ID_BYTES).
struct NcclId {
    std::array<unsigned char, 128> bytes{};
};

// A fresh id (ncclGetUniqueId): made once, by one rank, and given to every rank of the communicator.
NcclId nccl_unique_id();

// How long creating a communicator may wait for the other ranks (see the top of this file).
struct NcclInitWait {
    WaitBound bound;  // not bounded: a plain ncclCommInitRank, as without it
    NcclId probe_id;  // when bounded and world > 1: a second nccl_unique_id(), the same on every rank
};

// Threads mode: the devices of the ranks (rank r on devices[r]) and their shared id. The constructor
// refuses two ranks on one device (NCCL cannot run them: use the copy-engine backend to put several
// ranks on one GPU) and devices this process cannot see, before any rank starts, so no rank is left
// waiting in ncclCommInitRank for one that was refused.
class NcclThreadsWorld {
public:
    // `bound`: how long each rank's communicator creation may wait for the others.
    explicit NcclThreadsWorld(std::vector<int> devices, const WaitBound& bound = {});

    int world() const { return static_cast<int>(devices_.size()); }
    int device(int rank) const;
    const NcclId& id() const { return id_; }
    const NcclInitWait& init_wait() const { return wait_; }
    // Records that rank `rank`'s communicator exists; a second one for the same rank is an error.
    void claim(int rank);

private:
    std::vector<int> devices_;
    NcclId id_;
    NcclInitWait wait_;
    std::mutex mutex_;
    std::vector<bool> claimed_;
};

struct NcclState;  // nccl_communicator.cpp

class NcclCommunicator final : public Communicator {
public:
    // Rank `rank` of `world` on CUDA device `device`: ncclCommInitRank, which returns once every rank
    // has called it (so in threads mode each rank constructs its own on its own thread); with a bound
    // in `wait`, an error instead when the others have not all come within it.
    NcclCommunicator(const NcclId& id, int rank, int world, int device, const NcclInitWait& wait = {});
    ~NcclCommunicator() override;

    int rank() const override;
    int world() const override;
    std::string backend() const override { return "nccl"; }
    int device() const;

    // Staging for the sums of up to `bytes` (see staging_bytes_for); waits for the device. Needed
    // before capturing collectives into a CUDA graph.
    void reserve(std::size_t bytes);
    std::size_t staging_bytes() const;
    // The staging an all-reduce of `all_reduce_count` elements and a reduce-scatter of
    // `reduce_scatter_count` elements per rank (of `dtype`) need on a world of `world`. A reduce of
    // `count` elements needs, at its root, what a reduce-scatter of `count` per rank does (the other
    // ranks need none): pass max(reduce_scatter_count, count).
    static std::size_t staging_bytes_for(std::size_t all_reduce_count, std::size_t reduce_scatter_count, DType dtype,
                                         int world);

protected:
    void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, void* stream) override;
    void do_reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, void* stream) override;
    void do_reduce(const void* send, void* recv, std::size_t count, DType dtype, int root, void* stream) override;
    void do_all_gather(const void* send, void* recv, std::size_t send_count, DType dtype, void* stream) override;
    void do_broadcast(void* buffer, std::size_t count, DType dtype, int root, void* stream) override;
    // Returns once every rank has called it (synchronises an internal stream, not the caller's).
    void do_barrier() override;
    bool uses_stream() const override { return true; }

private:
    std::unique_ptr<NcclState> state_;
};

std::unique_ptr<NcclCommunicator> make_nccl_communicator(const NcclId& id, int rank, int world, int device,
                                                         const NcclInitWait& wait = {});
// Threads mode: claims rank `rank` of `world` and makes its communicator on world.device(rank). Call
// it on the rank's own thread (it waits for every rank's).
std::unique_ptr<NcclCommunicator> make_nccl_communicator(NcclThreadsWorld& world, int rank);

}  // namespace qtrain::comm
