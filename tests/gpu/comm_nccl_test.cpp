// The NCCL communicator: at world 1 (one rank in threads mode; what a one-GPU machine can run) every
// collective and a captured CUDA graph of them give the reference bits; with N GPUs, N ranks as
// threads do the same (skipped below two GPUs); two ranks on one device are refused, naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <exception>
#include <mutex>
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

using comm::NcclCommunicator;

// An all-reduce, a reduce-scatter and a reduce captured into a CUDA graph, then replayed twice (the second time
// over garbage in the outputs): NCCL's calls are capturable, and the backend adds no host work.
void check_captured(NcclCommunicator& c, cudaStream_t s, CheckLog& log, uint64_t seed) {
    const std::size_t count = 10007, w = static_cast<std::size_t>(c.world());
    c.reserve(NcclCommunicator::staging_bytes_for(count, count, DType::BF16, c.world()));
    const ReductionCase ar = reduction_case(c, DType::BF16, seed, count, 0, count);
    const ReductionCase rs =
        reduction_case(c, DType::BF16, seed + 1, w * count, static_cast<std::size_t>(c.rank()) * count, count);
    DeviceBuffer ar_send(ar.send.size()), ar_recv(ar.want.size()), rs_send(rs.send.size()), rs_recv(rs.want.size());
    upload_async(ar_send.get(), ar.send, s);
    upload_async(rs_send.get(), rs.send, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    const int root = c.world() - 1;  // the all-reduce's data, reduced to one rank
    DeviceBuffer red_recv(c.rank() == root ? ar.want.size() : 0);  // (no cudaMalloc while capturing)
    const std::size_t staging_before = c.staging_bytes();
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    c.all_reduce(ar_send.get(), ar_recv.get(), count, DType::BF16, s);
    c.reduce_scatter(rs_send.get(), rs_recv.get(), count, DType::BF16, s);
    c.reduce(ar_send.get(), red_recv.get(), count, DType::BF16, root, s);
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
        fill_async(ar_recv.get(), 0xFF, ar_recv.bytes(), s);
        fill_async(rs_recv.get(), 0xFF, rs_recv.bytes(), s);
        fill_async(red_recv.get(), 0xFF, red_recv.bytes(), s);
        CUDA_CHECK(cudaGraphLaunch(exec, s));
        std::vector<unsigned char> got_ar(ar.want.size()), got_rs(rs.want.size()), got_red(red_recv.bytes());
        download_async(got_ar, ar_recv.get(), s);
        download_async(got_rs, rs_recv.get(), s);
        download_async(got_red, red_recv.get(), s);
        CUDA_CHECK(cudaStreamSynchronize(s));
        const std::string when = " (graph replay " + std::to_string(replay) + ")";
        log.expect_same(c, label("all_reduce", DType::BF16, count, false) + when, got_ar.data(), ar.want.data(), count,
                        2);
        log.expect_same(c, label("reduce_scatter", DType::BF16, count, false) + when, got_rs.data(), rs.want.data(),
                        count, 2);
        if (c.rank() == root)
            log.expect_same(c, label("reduce", DType::BF16, count, false) + when, got_red.data(), ar.want.data(),
                            count, 2);
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    ++log.checks;
    if (c.staging_bytes() != staging_before) log.failures.push_back("the staging grew during capture");
}

CheckLog check_rank(NcclCommunicator& c, uint64_t seed) {
    RankStream s;
    CheckLog log = gpu_check_everything(c, s.get(), seed);
    const CheckLog more = gpu_check_back_to_back(c, s.get(), seed + 1);
    log.checks += more.checks;
    log.failures.insert(log.failures.end(), more.failures.begin(), more.failures.end());
    check_captured(c, s.get(), log, seed + 2);
    c.barrier();
    return log;
}

TEST(CommNccl, TwoRanksOnOneDeviceAreRefusedNamingTheDevice) {
    // Checked before NCCL is called, so this needs no GPU.
    EXPECT_ERROR(comm::NcclThreadsWorld({0, 0}), "ranks 0 and 1 are both on CUDA device 0",
                 "NCCL cannot run two ranks", "copy-engine");
    EXPECT_ERROR(comm::NcclThreadsWorld({1, 0, 2, 1}), "ranks 0 and 3 are both on CUDA device 1");
}

TEST(CommNccl, WorldOfOneRunsEveryCollectiveWithTheReferenceBits) {
    QTRAIN_REQUIRE_GPU();
    CUDA_CHECK(cudaSetDevice(0));
    comm::NcclThreadsWorld world({0});
    auto c = comm::make_nccl_communicator(world, 0);
    EXPECT_EQ(c->backend(), "nccl");
    EXPECT_EQ(c->world(), 1);
    const CheckLog log = check_rank(*c, 42);
    EXPECT_GE(log.checks, 70);
    for (const auto& f : log.failures) ADD_FAILURE() << f;
    EXPECT_ERROR(comm::make_nccl_communicator(world, 0), "rank 0 already has a communicator");
}

TEST(CommNccl, EveryGpuARankAsThreads) {
    QTRAIN_REQUIRE_GPU();
    const int n = std::min(cuda_device_count(), 8);
    if (n < 2) GTEST_SKIP() << "needs 2 or more GPUs, found " << n;
    std::vector<int> devices(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) devices[r] = r;
    // unbounded, and bounded (a probe communicator first, issue 29: comm_nccl_init_bound_test.cpp)
    for (const comm::WaitBound& bound : {comm::WaitBound{}, comm::WaitBound{60, "--rendezvous-timeout=60"}}) {
        SCOPED_TRACE(bound.bounded() ? "bounded" : "unbounded");
        comm::NcclThreadsWorld world(devices, bound);
        std::vector<CheckLog> logs(devices.size());
        std::vector<std::string> errors(devices.size());
        std::vector<std::thread> threads;
        for (int r = 0; r < n; ++r)
            threads.emplace_back([&, r] {
                try {
                    CUDA_CHECK(cudaSetDevice(r));
                    auto c = comm::make_nccl_communicator(world, r);
                    logs[r] = check_rank(*c, 42);
                    c->barrier();
                } catch (const std::exception& e) {
                    errors[r] = e.what();
                }
            });
        for (auto& t : threads) t.join();
        for (int r = 0; r < n; ++r) {
            EXPECT_EQ(errors[r], "") << "rank " << r;
            EXPECT_GE(logs[r].checks, 70) << "rank " << r;
            for (const auto& f : logs[r].failures) ADD_FAILURE() << f;
        }
    }
}

#else

TEST(CommNccl, NotBuilt) { GTEST_SKIP() << "built without NCCL (CMake did not find nccl.h and libnccl)"; }

#endif

}  // namespace
}  // namespace qtrain::test
