// Creating an NCCL communicator within a bound (issue 29, comm/cuda/nccl_communicator.h): a rank whose
// peers never call is an error naming it, its device, the bound and the flag, within seconds, where
// ncclCommInitRank waits forever; with everyone there a bounded creation gives a communicator that
// works (world 1 here; every GPU a rank, bounded and not: comm_nccl_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm_gpu_checks.h"

#if QTRAIN_HAVE_NCCL
#include "comm/cuda/nccl_communicator.h"
#endif

namespace qtrain::test {
namespace {

#if QTRAIN_HAVE_NCCL

const comm::WaitBound kTwoSeconds{2, "--rendezvous-timeout=2"};

// A world of 2 on GPU 0 where only rank 0 ever calls: before the bound, this waited forever.
TEST(CommNcclInitBound, ARankWhosePeerNeverComesFailsWithinTheBound) {
    QTRAIN_REQUIRE_GPU();
    CUDA_CHECK(cudaSetDevice(0));
    const comm::NcclId id = comm::nccl_unique_id();
    const comm::NcclInitWait wait{kTwoSeconds, comm::nccl_unique_id()};
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_ERROR(comm::make_nccl_communicator(id, 0, 2, 0, wait),
                 "NCCL communicator (rank 0 of 2, CUDA device 0): the other ranks did not all join the communicator's "
                 "creation within 2 s (--rendezvous-timeout=2)");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(seconds, 1.9);
    EXPECT_LT(seconds, 15) << "the abort of the waiting creation took long";
}

// The device is fine after the aborted creation, and a bounded world of one needs no probe.
TEST(CommNcclInitBound, ABoundedWorldOfOneWorks) {
    QTRAIN_REQUIRE_GPU();
    CUDA_CHECK(cudaSetDevice(0));
    comm::NcclThreadsWorld world({0}, kTwoSeconds);
    auto c = comm::make_nccl_communicator(world, 0);
    RankStream s;
    const CheckLog log = gpu_check_everything(*c, s.get(), 7);
    EXPECT_GE(log.checks, 60);
    for (const auto& f : log.failures) ADD_FAILURE() << f;
    c->barrier();
}

#else

TEST(CommNcclInitBound, NotBuilt) { GTEST_SKIP() << "built without NCCL (CMake did not find nccl.h and libnccl)"; }

#endif

}  // namespace
}  // namespace qtrain::test
