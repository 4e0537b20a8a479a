#include "comm/mpi/mpi_communicator.h"

#include <mpi.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include "comm/even_split.h"
#include "comm/peer_watch.h"
#include "comm/rank_order_sum.h"
#include "core/error.h"

namespace qtrain::comm {
namespace {

// Ends the job from anywhere (also before a communicator exists): the message first, flushed, since
// mpirun's own report of the abort says only which rank called it.
[[noreturn]] void abort_job(const std::string& message) {
    std::fprintf(stderr, "qtrain: %s\n", message.c_str());
    std::fflush(stderr);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
}

std::byte* at(void* p, std::size_t elements, DType dtype) {
    return static_cast<std::byte*>(p) + elements * dtype_size(dtype);
}

}  // namespace

struct MpiCommunicator::State {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Datatype two_bytes = MPI_DATATYPE_NULL, four_bytes = MPI_DATATYPE_NULL;
    int rank = 0, world = 1;
    bool owns_mpi = false;       // this object initialised MPI, so it finalises it
    int uncaught_at_start = 0;   // std::uncaught_exceptions() when constructed (see the destructor)

    std::string where() const { return cat("rank ", rank, " of ", world); }

    void check(int rc, const char* call) const {
        if (rc == MPI_SUCCESS) return;
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, text, &len);
        throw_error(cat("MPI: ", call, " failed on ", where(), ": ", std::string(text, static_cast<std::size_t>(len))));
    }

    // Elements travel as contiguous byte groups of the dtype's size: MPI needs no float type for
    // data it only moves (the sums are ours), and bf16/fp8 have no MPI type anyway.
    MPI_Datatype type_of(DType dtype) const {
        switch (dtype_size(dtype)) {
            case 1: return MPI_BYTE;
            case 2: return two_bytes;
            case 4: return four_bytes;
        }
        throw_error(cat("MPI communicator: no element type for ", dtype_name(dtype)));
    }

    // MPI counts are int: larger calls are refused rather than truncated.
    int as_count(std::size_t count, const char* op) const {
        QT_CHECK(count <= static_cast<std::size_t>(INT_MAX), op, " (mpi communicator, ", where(), "): ", count,
                 " elements exceed MPI's int count; split the call");
        return static_cast<int>(count);
    }
};

MpiCommunicator::MpiCommunicator() : state_(std::make_unique<State>()) {
    State& s = *state_;
    s.uncaught_at_start = std::uncaught_exceptions();
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    QT_CHECK(!finalized, "MPI communicator: MPI was already finalised in this process (one communicator per process)");
    if (!initialized) {
        int provided = 0;
        QT_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) == MPI_SUCCESS,
                 "MPI communicator: MPI_Init_thread failed");
        s.owns_mpi = true;
        QT_CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI communicator: this MPI provides thread level ", provided,
                 ", qtrain needs MPI_THREAD_SERIALIZED (", MPI_THREAD_SERIALIZED, ")");
    }
    // Our own communicator: its traffic cannot match another library's messages on MPI_COMM_WORLD,
    // and its error handler (return, not abort) is ours to set.
    QT_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &s.comm) == MPI_SUCCESS, "MPI communicator: MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN);
    s.check(MPI_Comm_rank(s.comm, &s.rank), "MPI_Comm_rank");
    s.check(MPI_Comm_size(s.comm, &s.world), "MPI_Comm_size");
    s.check(MPI_Type_contiguous(2, MPI_BYTE, &s.two_bytes), "MPI_Type_contiguous");
    s.check(MPI_Type_commit(&s.two_bytes), "MPI_Type_commit");
    s.check(MPI_Type_contiguous(4, MPI_BYTE, &s.four_bytes), "MPI_Type_contiguous");
    s.check(MPI_Type_commit(&s.four_bytes), "MPI_Type_commit");
}

MpiCommunicator::~MpiCommunicator() {
    State& s = *state_;
    // Destroyed while an exception unwinds (the caller did not go through run_mpi_rank): peers may be
    // waiting in a collective, and MPI_Finalize would wait for them. End the job instead.
    if (std::uncaught_exceptions() > s.uncaught_at_start)
        abort_job(cat(s.where(), " failed: the MPI communicator was destroyed by an exception"));
    MPI_Type_free(&s.two_bytes);
    MPI_Type_free(&s.four_bytes);
    MPI_Comm_free(&s.comm);
    if (s.owns_mpi) MPI_Finalize();
}

int MpiCommunicator::rank() const { return state_->rank; }
int MpiCommunicator::world() const { return state_->world; }

void MpiCommunicator::abort(const std::string& reason) const { abort_job(cat(state_->where(), " failed: ", reason)); }

void MpiCommunicator::do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, void*) {
    const State& s = *state_;
    const MPI_Datatype type = s.type_of(dtype);
    s.as_count(count, "all_reduce");
    // Each rank sums one share of the elements: it receives that share from every rank, in rank
    // order in the scratch, adds them in that order, and the summed shares are gathered back.
    std::vector<int> counts(s.world), offsets(s.world), recv_counts(s.world), recv_offsets(s.world);
    for (int q = 0; q < s.world; ++q) {
        const Share share = even_split(count, s.world, q);
        counts[q] = static_cast<int>(share.count);
        offsets[q] = static_cast<int>(share.offset);
    }
    const Share mine = even_split(count, s.world, s.rank);
    s.as_count(mine.count * static_cast<std::size_t>(s.world), "all_reduce");
    for (int q = 0; q < s.world; ++q) {
        recv_counts[q] = static_cast<int>(mine.count);
        recv_offsets[q] = q * static_cast<int>(mine.count);
    }
    std::vector<std::byte> scratch(mine.count * static_cast<std::size_t>(s.world) * dtype_size(dtype));
    s.check(MPI_Alltoallv(send, counts.data(), offsets.data(), type, scratch.data(), recv_counts.data(),
                          recv_offsets.data(), type, s.comm),
            "MPI_Alltoallv");
    // The send buffer is no longer needed (Alltoallv has completed), so recv == send is fine.
    if (mine.count) {
        std::vector<const void*> sources(s.world);
        for (int q = 0; q < s.world; ++q) sources[q] = at(scratch.data(), q * mine.count, dtype);
        sum_in_rank_order(sources.data(), s.world, mine.count, dtype, at(recv, mine.offset, dtype));
    }
    s.check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, counts.data(), offsets.data(), type, s.comm),
            "MPI_Allgatherv");
}

void MpiCommunicator::do_reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, void*) {
    const State& s = *state_;
    const int n = s.as_count(recv_count, "reduce_scatter");
    std::vector<std::byte> scratch(recv_count * static_cast<std::size_t>(s.world) * dtype_size(dtype));
    // Block q of the scratch = rank q's block `rank`; in place (recv inside send) is fine, as the
    // Alltoall has read send before recv is written.
    s.check(MPI_Alltoall(send, n, s.type_of(dtype), scratch.data(), n, s.type_of(dtype), s.comm), "MPI_Alltoall");
    if (!recv_count) return;
    std::vector<const void*> sources(s.world);
    for (int q = 0; q < s.world; ++q) sources[q] = at(scratch.data(), q * recv_count, dtype);
    sum_in_rank_order(sources.data(), s.world, recv_count, dtype, recv);
}

void MpiCommunicator::do_reduce(const void* send, void* recv, std::size_t count, DType dtype, int root, void*) {
    const State& s = *state_;
    const MPI_Datatype type = s.type_of(dtype);
    const int n = s.as_count(count, "reduce");
    if (count == 0) return;  // every rank has the same count, so all return here
    const bool is_root = s.rank == root;
    // At the root: peer q's send lands in slot q (ranks below the root) or q - 1 (above), and the root
    // sends nothing to itself (its own send is read where it is, so in place needs no copy).
    std::vector<int> counts, offsets;
    std::vector<std::byte> scratch;
    if (is_root) {
        s.as_count(count * static_cast<std::size_t>(s.world - 1), "reduce");  // displacements are int too
        counts.assign(static_cast<std::size_t>(s.world), n);
        offsets.assign(counts.size(), 0);
        counts[static_cast<std::size_t>(root)] = 0;
        for (int q = 0; q < s.world; ++q) offsets[q] = (q > root ? q - 1 : q) * n;
        scratch.resize(count * static_cast<std::size_t>(s.world - 1) * dtype_size(dtype));
    }
    s.check(MPI_Gatherv(send, is_root ? 0 : n, type, scratch.data(), counts.data(), offsets.data(), type, root, s.comm),
            "MPI_Gatherv");
    if (!is_root) return;
    std::vector<const void*> sources(s.world);
    for (int q = 0; q < s.world; ++q)
        sources[q] = q == root ? send : at(scratch.data(), static_cast<std::size_t>(q < root ? q : q - 1) * count, dtype);
    sum_in_rank_order(sources.data(), s.world, count, dtype, recv);
}

void MpiCommunicator::do_all_gather(const void* send, void* recv, std::size_t send_count, DType dtype, void*) {
    const State& s = *state_;
    const int n = s.as_count(send_count, "all_gather");
    const MPI_Datatype type = s.type_of(dtype);
    const bool in_place = send_count && send == at(recv, static_cast<std::size_t>(s.rank) * send_count, dtype);
    if (in_place)
        s.check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, type, s.comm), "MPI_Allgather");
    else
        s.check(MPI_Allgather(send, n, type, recv, n, type, s.comm), "MPI_Allgather");
}

void MpiCommunicator::do_broadcast(void* buffer, std::size_t count, DType dtype, int root, void*) {
    const State& s = *state_;
    s.check(MPI_Bcast(buffer, s.as_count(count, "broadcast"), s.type_of(dtype), root, s.comm), "MPI_Bcast");
}

void MpiCommunicator::do_barrier() { state_->check(MPI_Barrier(state_->comm), "MPI_Barrier"); }

namespace {

// The other ranks on this host, by their processes: every rank's host name and pid, gathered.
std::vector<PeerWatch::Peer> local_peers(Communicator& comm) {
    struct Process {
        char host[256];
        long long pid;
    } mine{};
    gethostname(mine.host, sizeof mine.host - 1);
    mine.pid = getpid();
    std::vector<Process> all(static_cast<std::size_t>(comm.world()));
    comm.all_gather(&mine, all.data(), sizeof mine, DType::U8);
    std::vector<PeerWatch::Peer> peers;
    for (int q = 0; q < comm.world(); ++q)
        if (q != comm.rank() && std::strncmp(all[q].host, mine.host, sizeof mine.host) == 0)
            peers.push_back({q, static_cast<long>(all[q].pid)});
    return peers;
}

}  // namespace

int run_mpi_rank(const RankFunction& fn) {
    std::unique_ptr<MpiCommunicator> comm;
    try {
        comm = std::make_unique<MpiCommunicator>();
    } catch (const std::exception& e) {
        abort_job(cat("could not start the MPI communicator: ", e.what()));
    }
    std::unique_ptr<PeerWatch> watch;
    try {
        watch = std::make_unique<PeerWatch>(cat("rank ", comm->rank(), " of ", comm->world()), local_peers(*comm),
                                            [](const std::string& line) {
                                                std::fprintf(stderr, "qtrain: %s\n", line.c_str());
                                                std::fflush(stderr);
                                            });
        fn(*comm);
        // Ranks leave at slightly different times: none may leave before every watch knows that is fine.
        watch->finishing();
        comm->barrier();
    } catch (const std::exception& e) {
        comm->abort(e.what());
    } catch (...) {
        comm->abort("an exception that is not a std::exception");
    }
    watch.reset();
    comm.reset();  // finalises MPI
    return 0;
}

}  // namespace qtrain::comm
