// Whether this process was started by OpenMPI's mpirun, and as which rank: read from the variables
// mpirun sets for each process, so the launcher can decide before (and without) initialising MPI, and
// builds without MPI can still say "this is an mpirun launch, but MPI support was not built".
#pragma once

#include <functional>
#include <optional>

namespace qtrain::comm {

struct MpiLaunch {
    int rank = 0;        // OMPI_COMM_WORLD_RANK
    int world = 1;       // OMPI_COMM_WORLD_SIZE
    int local_rank = 0;  // OMPI_COMM_WORLD_LOCAL_RANK: the rank among this node's processes (its GPU)
};

// nullopt when none of the three variables is set (not under mpirun). A qtrain::Error naming the
// variable when only some are set, or one is not a number in range (rank < world, local_rank <= rank).
std::optional<MpiLaunch> detect_mpi_launch();
// The same over another environment (tests): `lookup(name)` returns the value or null.
std::optional<MpiLaunch> detect_mpi_launch(const std::function<const char*(const char*)>& lookup);

}  // namespace qtrain::comm
