// Bad arguments get a clear error before any backend work (on a world of one thread rank, where no
// peer is involved).
#include <gtest/gtest.h>

#include <vector>

#include "comm/thread_communicator.h"
#include "test_util.h"

namespace qtrain::test {
namespace {

TEST(CommArgs, RejectsWhatNoBackendCanDo) {
    comm::ThreadWorld world(1);
    auto c = comm::make_thread_communicator(world, 0);
    std::vector<float> a(16), b(16);
    int stream_stand_in = 0;
    EXPECT_ERROR(c->all_reduce(a.data(), b.data(), 4, DType::F16), "all_reduce (threads communicator, rank 0 of 1)",
                 "sums are implemented for fp32 and bf16, got fp16");
    EXPECT_ERROR(c->reduce_scatter(a.data(), b.data(), 4, DType::I32), "reduce_scatter", "got int32");
    EXPECT_ERROR(c->all_reduce(a.data(), b.data(), 4, DType::F32, &stream_stand_in), "takes no stream");
    EXPECT_ERROR(c->all_reduce(nullptr, b.data(), 4, DType::F32), "send is null for a count of 4");
    EXPECT_ERROR(c->all_gather(a.data(), nullptr, 4, DType::F32), "recv is null");
    EXPECT_ERROR(c->broadcast(a.data(), 4, DType::F32, 1), "root 1 is not a rank (world size 1)");
    EXPECT_ERROR(c->broadcast(a.data(), 4, DType::F32, -1), "root -1 is not a rank");
    // Partial overlaps: only the in-place positions are allowed.
    EXPECT_ERROR(c->all_reduce(a.data(), a.data() + 1, 4, DType::F32), "the only overlap allowed is in place, recv == send");
    EXPECT_ERROR(c->reduce_scatter(a.data(), a.data() + 1, 4, DType::F32), "recv == send + rank * recv_count");
    EXPECT_ERROR(c->all_gather(a.data() + 2, a.data(), 4, DType::F32), "send == recv + rank * send_count");
    EXPECT_ERROR(c->all_reduce(a.data(), b.data(), SIZE_MAX / 2, DType::F32), "overflows a byte size");
    EXPECT_ERROR(c->reduce(a.data(), b.data(), 4, DType::F16, 0), "reduce (threads communicator, rank 0 of 1)",
                 "got fp16");
    EXPECT_ERROR(c->reduce(a.data(), b.data(), 4, DType::F32, 1), "reduce", "root 1 is not a rank (world size 1)");
    EXPECT_ERROR(c->reduce(a.data(), b.data(), 4, DType::F32, 0, &stream_stand_in), "takes no stream");
    EXPECT_ERROR(c->reduce(nullptr, b.data(), 4, DType::F32, 0), "send is null for a count of 4");
    EXPECT_ERROR(c->reduce(a.data(), nullptr, 4, DType::F32, 0), "recv is null");  // on the root it is written
    EXPECT_ERROR(c->reduce(a.data(), a.data() + 1, 4, DType::F32, 0), "recv == send (on the root)");
    // Zero elements need no buffers.
    c->all_reduce(nullptr, nullptr, 0, DType::F32);
    c->all_gather(nullptr, nullptr, 0, DType::E4M3);
    c->reduce(nullptr, nullptr, 0, DType::BF16, 0);
}

TEST(CommArgs, WorldOfOneCopiesAndKeepsInPlaceData) {
    comm::ThreadWorld world(1);
    auto c = comm::make_thread_communicator(world, 0);
    EXPECT_EQ(c->rank(), 0);
    EXPECT_EQ(c->world(), 1);
    EXPECT_EQ(c->backend(), "threads");
    std::vector<float> a = {1.5f, -2.0f, 3.25f}, b(3, 0.0f);
    c->all_reduce(a.data(), b.data(), 3, DType::F32);
    EXPECT_EQ(b, a);
    c->all_reduce(a.data(), a.data(), 3, DType::F32);
    EXPECT_EQ(a, (std::vector<float>{1.5f, -2.0f, 3.25f}));
}

}  // namespace
}  // namespace qtrain::test
