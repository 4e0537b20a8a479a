// mpirun launch detection from OpenMPI's per-process variables.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "comm/mpi_launch.h"
#include "test_util.h"

namespace qtrain::test {
namespace {

std::optional<comm::MpiLaunch> detect(const std::map<std::string, std::string>& env) {
    return comm::detect_mpi_launch([&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
    });
}

TEST(CommMpiLaunch, ReadsOpenMpisVariables) {
    EXPECT_FALSE(detect({}).has_value());
    const auto l = detect({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
    ASSERT_TRUE(l.has_value());
    EXPECT_EQ(l->rank, 5);
    EXPECT_EQ(l->world, 8);
    EXPECT_EQ(l->local_rank, 1);
}

TEST(CommMpiLaunch, InconsistentVariablesAreErrors) {
    EXPECT_ERROR(detect({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
                 "OMPI_COMM_WORLD_LOCAL_RANK is not set although");
    EXPECT_ERROR(detect({{"OMPI_COMM_WORLD_RANK", "x1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}),
                 "OMPI_COMM_WORLD_RANK='x1' is not a non-negative integer");
    EXPECT_ERROR(detect({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}),
                 "OMPI_COMM_WORLD_RANK=2 is not a rank of OMPI_COMM_WORLD_SIZE=2");
    EXPECT_ERROR(detect({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}),
                 "OMPI_COMM_WORLD_LOCAL_RANK=2 exceeds");
}

}  // namespace
}  // namespace qtrain::test
