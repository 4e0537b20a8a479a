// The collectives data-parallel training needs (all-reduce, reduce-scatter, reduce, all-gather,
// broadcast, barrier) behind one interface, so the trainer and the sharded model never know whether the ranks
// are threads of one process, MPI processes or NCCL ranks on GPUs.
//
// Every call is collective: all ranks of the world call the same collectives in the same order with
// the same count, dtype and root. Buffers are raw pointers (host memory for the CPU backends, device
// memory for GPU ones); `stream` is an opaque handle (a cudaStream_t for GPU backends, which queue the
// collective on it and return; must be null for the CPU backends, which complete before returning),
// so this header needs no CUDA.
//
// Sums are deterministic: element i of a reduction is ((x_0[i] + x_1[i]) + x_2[i]) + ... in rank
// order 0..N-1, accumulated in fp32 and rounded once to the buffer's dtype. So a result is bit-identical
// run to run, whatever the backend's algorithm, and the same elements summed by an all-reduce or by a
// reduce-scatter or a reduce agree bit for bit (what makes ZeRO-1 and ZeRO-2 equal). Each backend says how it
// guarantees this (for MPI and NCCL the library's own reduction does not; see their headers).
//
// Dtypes: reductions take fp32 and bf16 (bf16: each element summed in fp32 in rank order, rounded once
// to nearest even; the exact sum a bf16 training step wants, no per-hop rounding). all_gather and
// broadcast move bytes, so any dtype.
//
// In place (NCCL's and MPI's conventions; any other overlap of send and recv is an error):
//   all_reduce:     recv == send.
//   reduce_scatter: recv == send + rank * recv_count elements (the rank's own block of send).
//   reduce:         recv == send on the root (the other ranks' recv is neither read nor written).
//   all_gather:     send == recv + rank * send_count elements (the rank's own block of recv).
//   broadcast:      always in place (one buffer: root's is sent, the others' are overwritten).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qtrain::comm {

class Communicator {
public:
    virtual ~Communicator() = default;
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    virtual int rank() const = 0;
    virtual int world() const = 0;
    // "threads", "mpi", ...: for messages and logs.
    virtual std::string backend() const = 0;

    // recv[i] = sum over ranks of send[i], i < count, on every rank.
    void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, void* stream = nullptr);
    // send holds world() blocks of recv_count elements; rank r's recv = sum over ranks of their block r.
    void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, void* stream = nullptr);
    // On rank `root` only: recv[i] = sum over ranks of send[i], i < count (all_reduce's bits). The
    // other ranks' recv is not written and may be null. The data volume of a reduce to one rank (each
    // non-root's send crosses once, the root sums), for ZeRO-2's gradients going to the rank that owns
    // them; on a GPU backend the call completes on a non-root's stream once the root has its data.
    void reduce(const void* send, void* recv, std::size_t count, DType dtype, int root, void* stream = nullptr);
    // recv holds world() blocks of send_count elements; block r = rank r's send.
    void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype, void* stream = nullptr);
    // Every rank's buffer becomes root's.
    void broadcast(void* buffer, std::size_t count, DType dtype, int root, void* stream = nullptr);
    // Returns once every rank has called it.
    void barrier();
    // This rank has failed (`reason`) and will make no more calls: peers blocked in or entering a
    // collective of this communicator fail with an error naming it instead of waiting. A backend
    // whose failures already end every rank (MPI's MPI_Abort) or that cannot be interrupted does nothing.
    virtual void abort(const std::string& reason) { (void)reason; }

protected:
    Communicator() = default;
    // The backends' halves: arguments are checked (dtype, null pointers, overlap, root, stream) by
    // the public calls above, so every backend rejects the same mistakes with the same message.
    virtual void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, void* stream) = 0;
    virtual void do_reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype,
                                   void* stream) = 0;
    virtual void do_reduce(const void* send, void* recv, std::size_t count, DType dtype, int root, void* stream) = 0;
    virtual void do_all_gather(const void* send, void* recv, std::size_t send_count, DType dtype,
                               void* stream) = 0;
    virtual void do_broadcast(void* buffer, std::size_t count, DType dtype, int root, void* stream) = 0;
    virtual void do_barrier() = 0;
    // Whether the backend takes a stream (GPU) or needs it null (CPU: nothing would order the host
    // work after the GPU's, so a stream passed by mistake must not be silently ignored).
    virtual bool uses_stream() const { return false; }
};

// sums[i] = values[i] summed over the ranks in rank order, in double, on every rank: for the few
// host scalars a step agrees on (losses, partial sums of squares, counts: exact up to 2^53), which the
// fp32/bf16 sums would round. Gathered as bytes, so every backend gives the same bits.
void sum_scalars_over_ranks(Communicator& comm, const double* values, double* sums, int n);

// Root's `value` on every rank (a path or a message one rank decided, e.g. where a checkpoint goes);
// the other ranks' `value` is ignored. Collective.
std::string broadcast_string(Communicator& comm, const std::string& value, int root = 0);

// Root's bytes on every rank (an NCCL unique id sent over the host communicator, ...); the other
// ranks' `value` is ignored. Collective.
std::vector<std::byte> broadcast_bytes(Communicator& comm, const std::vector<std::byte>& value, int root = 0);

// What a launcher (run_ranks, run_mpi_rank) runs as each rank.
using RankFunction = std::function<void(Communicator&)>;

}  // namespace qtrain::comm
