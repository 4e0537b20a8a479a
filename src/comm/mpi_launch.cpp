#include "comm/mpi_launch.h"

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace qtrain::comm {
namespace {

int parse_count(const char* name, const char* value) {
    int v = -1;
    const char* end = value + std::strlen(value);
    const auto [ptr, ec] = std::from_chars(value, end, v);
    QT_CHECK(ec == std::errc() && ptr == end && v >= 0, "mpirun launch: ", name, "='", value,
             "' is not a non-negative integer");
    return v;
}

}  // namespace

std::optional<MpiLaunch> detect_mpi_launch(const std::function<const char*(const char*)>& lookup) {
    const char* names[3] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"};
    const char* values[3];
    int set = 0;
    for (int i = 0; i < 3; ++i) set += (values[i] = lookup(names[i])) != nullptr;
    if (set == 0) return std::nullopt;
    for (int i = 0; i < 3; ++i)
        QT_CHECK(values[i], "mpirun launch: ", names[i], " is not set although ",
                 values[(i + 1) % 3] ? names[(i + 1) % 3] : names[(i + 2) % 3],
                 " is (OpenMPI's mpirun sets all three)");
    MpiLaunch launch{parse_count(names[0], values[0]), parse_count(names[1], values[1]),
                     parse_count(names[2], values[2])};
    QT_CHECK(launch.world >= 1 && launch.rank < launch.world, "mpirun launch: OMPI_COMM_WORLD_RANK=", launch.rank,
             " is not a rank of OMPI_COMM_WORLD_SIZE=", launch.world);
    QT_CHECK(launch.local_rank <= launch.rank, "mpirun launch: OMPI_COMM_WORLD_LOCAL_RANK=", launch.local_rank,
             " exceeds OMPI_COMM_WORLD_RANK=", launch.rank);
    return launch;
}

std::optional<MpiLaunch> detect_mpi_launch() {
    return detect_mpi_launch([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace qtrain::comm
