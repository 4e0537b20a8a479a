// The MPI backend's test program, started by ctest under mpirun (-np 2 and -np 3):
//   mpi_check collectives      the checks of collective_checks.h (the threads tests' own), bit for bit
//                              against the sequential rank-order reference; exit 1 if any fails
//   mpi_check fail <rank>      rank <rank> throws between two collectives; mpirun must end every rank
//                              with an error naming it (tests/scripts/mpi_failure_test.sh checks that)
// It is its own executable, not a gtest: each process is one rank, and the checks need all of them.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "collective_checks.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi_launch.h"
#include "core/error.h"

namespace {

using qtrain::comm::Communicator;

void collectives(Communicator& c) {
    // mpirun's variables must agree with MPI's own view.
    const auto launch = qtrain::comm::detect_mpi_launch();
    QT_CHECK(launch && launch->rank == c.rank() && launch->world == c.world(),
             "OMPI_COMM_WORLD_* do not match MPI's rank and size (", c.rank(), " of ", c.world(), ")");
    if (c.world() >= 3)
        QT_CHECK(qtrain::test::order_sensitive(qtrain::test::world_data(42, c.world(), 1237)) > 50,
                 "the test data do not make the summation order matter");

    const qtrain::test::CheckLog log = qtrain::test::check_everything(c, 42);
    for (const auto& f : log.failures) std::fprintf(stderr, "FAIL %s\n", f.c_str());
    // Every rank learns the total, so all exit the same way (and rank 0's summary covers all).
    float failed = static_cast<float>(log.failures.size()), total = 0;
    c.all_reduce(&failed, &total, 1, qtrain::DType::F32);
    if (c.rank() == 0)
        std::printf("mpi_check: %d checks per rank on %d ranks, %g failed\n", log.checks, c.world(), total);
    QT_CHECK(total == 0, total, " collective checks failed (FAIL lines above)");
}

void fail(Communicator& c, int failing_rank) {
    std::vector<float> x(64, 1.0f);
    c.all_reduce(x.data(), x.data(), x.size(), qtrain::DType::F32);
    if (c.rank() == failing_rank) throw qtrain::Error("deliberate failure on rank " + std::to_string(failing_rank));
    // The others wait here for the failed rank; only MPI_Abort can end them.
    c.all_reduce(x.data(), x.data(), x.size(), qtrain::DType::F32);
    c.barrier();
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "collectives") return qtrain::comm::run_mpi_rank(collectives);
    if (mode == "fail" && argc > 2) {
        const int rank = std::atoi(argv[2]);
        return qtrain::comm::run_mpi_rank([rank](Communicator& c) { fail(c, rank); });
    }
    std::fprintf(stderr, "usage: mpi_check collectives | mpi_check fail <rank>\n");
    return 2;
}
