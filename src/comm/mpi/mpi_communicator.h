// The MPI backend (OpenMPI): one rank per process under mpirun, host buffers, each collective complete
// before it returns (stream must be null). Built only when CMake finds MPI (QTRAIN_HAVE_MPI); this
// header does not include mpi.h.
//
// Determinism: OpenMPI does not sum in rank order. MPI_Allreduce and MPI_Reduce_scatter_block pick an
// algorithm by message and world size (recursive doubling/halving, ring, Rabenseifner, ...), whose
// additions are grouped as the algorithm's tree or ring goes, e.g. (x0 + x1) + (x2 + x3); the MPI
// standard only requires that all ranks get the same value, and advises applications that need an
// order to gather the operands and reduce them themselves. So the sums here move raw data and add
// locally with sum_in_rank_order (rank order, fp32, one rounding), giving the threads backend's bits:
//   reduce_scatter: MPI_Alltoall (rank r receives every rank's block r), then the local ordered sum.
//   all_reduce:     the same over even shares of the elements (MPI_Alltoallv), then MPI_Allgatherv of
//                   the summed shares: the bandwidth of a reduce-scatter + all-gather ring, with a
//                   scratch of about `count` elements.
//   reduce:         MPI_Gatherv of the non-roots' raw sends into the root's scratch ((N-1) * count
//                   elements), then the root's ordered sum (not MPI_Reduce, whose order is its tree's).
// all_gather and broadcast move bytes (MPI_Allgather, MPI_Bcast), exact by nature.
//
// Failure: MPI calls return errors here (MPI_ERRORS_RETURN on the communicator's own duplicate of
// MPI_COMM_WORLD) and become a qtrain::Error naming the call and the rank; run_mpi_rank turns any
// error into MPI_Abort, which makes mpirun end every rank, so peers never wait forever for a failed
// one. Not caught: ranks that disagree on the sequence of collectives (they wait for each other, as in
// any MPI program); the threads backend detects that, so tests find such bugs there.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace qtrain::comm {

class MpiCommunicator final : public Communicator {
public:
    // Initialises MPI (MPI_Init_thread, MPI_THREAD_SERIALIZED: one thread at a time, not necessarily the
    // main one) unless it already is, and duplicates MPI_COMM_WORLD. One per process: MPI can be
    // initialised once, and the destructor finalises it when this object initialised it.
    MpiCommunicator();
    ~MpiCommunicator() override;

    int rank() const override;
    int world() const override;
    std::string backend() const override { return "mpi"; }

    // Prints "qtrain: rank R of N failed: <reason>" on stderr and ends the whole job (MPI_Abort).
    [[noreturn]] void abort(const std::string& reason) const;

protected:
    void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, void* stream) override;
    void do_reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, void* stream) override;
    void do_reduce(const void* send, void* recv, std::size_t count, DType dtype, int root, void* stream) override;
    void do_all_gather(const void* send, void* recv, std::size_t send_count, DType dtype, void* stream) override;
    void do_broadcast(void* buffer, std::size_t count, DType dtype, int root, void* stream) override;
    void do_barrier() override;

private:
    struct State;
    std::unique_ptr<State> state_;
};

// Runs fn as this process's rank of the mpirun job: makes the communicator, calls fn, finalises MPI and
// returns 0. If anything throws, prints the error naming this rank and ends every rank (MPI_Abort), so
// a failing rank never leaves its peers waiting. Meanwhile a PeerWatch (comm/peer_watch.h) names a
// rank on this host whose process ends without a word (SIGKILL, the OOM killer), which OpenMPI reports
// only in its own terms; at the normal end every rank tells its watch before a last barrier.
int run_mpi_rank(const RankFunction& fn);

}  // namespace qtrain::comm
