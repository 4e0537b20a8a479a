// The threads backend never hangs: a rank that throws, aborts, returns early, never arrives or calls
// another collective stops every rank with an error that names it, quickly (or after the timeout).
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/run_ranks.h"
#include "comm/thread_communicator.h"
#include "test_util.h"

namespace qtrain::test {
namespace {

using comm::Communicator;
using namespace std::chrono_literals;

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs fn on `world` ranks and records each rank's own error (the one it saw, before run_ranks folds
// them into one), so a test can check that every rank was stopped, not only the caller's view.
struct Outcome {
    std::string error;                  // what run_ranks threw ("" if nothing)
    std::vector<std::string> per_rank;  // what each rank's fn threw
    double seconds = 0;
};
template <class F>
Outcome run_and_record(int world, std::chrono::milliseconds timeout, F fn) {
    Outcome out;
    out.per_rank.resize(static_cast<std::size_t>(world));
    std::mutex m;
    const auto t0 = std::chrono::steady_clock::now();
    try {
        comm::run_ranks(
            world,
            [&](Communicator& c) {
                try {
                    fn(c);
                } catch (const std::exception& e) {
                    std::lock_guard lock(m);
                    out.per_rank[static_cast<std::size_t>(c.rank())] = e.what();
                    throw;
                }
            },
            timeout);
    } catch (const Error& e) {
        out.error = e.what();
    }
    out.seconds = seconds_since(t0);
    return out;
}

void some_all_reduce(Communicator& c) {
    std::vector<float> x(100, 1.0f);
    c.all_reduce(x.data(), x.data(), x.size(), DType::F32);
}

TEST(CommThreadFailure, ARankThatThrowsStopsTheOthersNamingIt) {
    // Rank 1 fails after two good collectives, while ranks 0 and 2 wait for it in the third; the
    // timeout is long, so only the failure report can release them in time.
    const Outcome out = run_and_record(3, 60s, [](Communicator& c) {
        some_all_reduce(c);
        some_all_reduce(c);
        if (c.rank() == 1) throw Error("deliberate failure reading shard.bin");
        some_all_reduce(c);
        some_all_reduce(c);
    });
    EXPECT_TRUE(Contains(out.error, "rank 1 of 3 failed: deliberate failure reading shard.bin"));
    for (int r : {0, 2}) {
        EXPECT_TRUE(Contains(out.per_rank[r], "rank 1 of 3 failed: deliberate failure reading shard.bin"));
        EXPECT_TRUE(Contains(out.per_rank[r], "rank " + std::to_string(r) + " stopped"));
    }
    EXPECT_LT(out.seconds, 5.0);
}

TEST(CommThreadFailure, AbortStopsEveryRankInOrEnteringACollective) {
    comm::ThreadWorld world(4, 60s);
    std::vector<std::string> seen(4);
    const auto t0 = std::chrono::steady_clock::now();
    auto rank_fn = [&](Communicator& c) {
        try {
            if (c.rank() == 2) {
                std::this_thread::sleep_for(50ms);  // the others are waiting in the barrier by now
                world.abort(2, "token file is corrupt");
            }
            c.barrier();  // rank 2 enters after aborting
        } catch (const Error& e) {
            seen[c.rank()] = e.what();
            throw;
        }
    };
    EXPECT_ERROR(comm::run_ranks(world, rank_fn), "rank 2 of 4 failed: token file is corrupt");
    EXPECT_LT(seconds_since(t0), 5.0);
    for (int r = 0; r < 4; ++r) EXPECT_TRUE(Contains(seen[r], "rank 2 of 4 failed: token file is corrupt")) << r;
    EXPECT_EQ(world.failed_rank(), 2);
}

TEST(CommThreadFailure, ARankThatNeverArrivesTimesOutNamingIt) {
    // Rank 2 arrives 600 ms after the 200 ms timeout: ranks 0 and 1 give up naming it, and rank 2, when it
    // finally enters, gets the same error instead of waiting.
    const Outcome out = run_and_record(3, 200ms, [](Communicator& c) {
        some_all_reduce(c);
        if (c.rank() == 2) std::this_thread::sleep_for(800ms);
        some_all_reduce(c);
    });
    EXPECT_TRUE(Contains(out.error, "all_reduce #1 (count 100, fp32): rank(s) 2 of 3 did not arrive within 0.2 s"));
    for (int r = 0; r < 3; ++r) EXPECT_TRUE(Contains(out.per_rank[r], "rank(s) 2 of 3 did not arrive")) << r;
    EXPECT_GE(out.seconds, 0.75);  // the join waits for rank 2's sleep, not longer
    EXPECT_LT(out.seconds, 5.0);
}

TEST(CommThreadFailure, ARankThatReturnsEarlyFailsItsPeersAtOnce) {
    const Outcome out = run_and_record(3, 60s, [](Communicator& c) {
        some_all_reduce(c);
        if (c.rank() == 0) return;  // skips the last collective
        some_all_reduce(c);
    });
    EXPECT_TRUE(Contains(out.error, "rank(s) 0 of 3 returned without calling all_reduce #1"));
    EXPECT_TRUE(out.per_rank[0].empty());
    EXPECT_LT(out.seconds, 5.0);
}

TEST(CommThreadFailure, MismatchedCollectivesFailListingEachRanksCall) {
    const Outcome out = run_and_record(2, 60s, [](Communicator& c) {
        std::vector<float> x(10, 1.0f);
        if (c.rank() == 0)
            c.all_reduce(x.data(), x.data(), 10, DType::F32);
        else
            c.all_reduce(x.data(), x.data(), 9, DType::F32);
    });
    EXPECT_TRUE(Contains(out.error, "the ranks called different collectives; rank 0: all_reduce #0 (count 10, fp32); "
                                    "rank 1: all_reduce #0 (count 9, fp32)"));
    const Outcome other = run_and_record(2, 60s, [](Communicator& c) {
        std::vector<float> x(10, 1.0f);
        if (c.rank() == 0) c.barrier();
        else c.broadcast(x.data(), 10, DType::F32, 0);
    });
    EXPECT_TRUE(Contains(other.error, "rank 0: barrier #0; rank 1: broadcast #0 (count 10, fp32, root 0)"));
    // A reduce whose ranks disagree on the root (each would wait for the data at its own root).
    const Outcome roots = run_and_record(3, 60s, [](Communicator& c) {
        std::vector<float> x(10, 1.0f), y(10);
        c.reduce(x.data(), y.data(), 10, DType::F32, c.rank() == 2 ? 1 : 0);
    });
    EXPECT_TRUE(Contains(roots.error, "the ranks called different collectives; rank 0: reduce #0 (count 10, fp32, "
                                      "root 0); rank 1: reduce #0 (count 10, fp32, root 0); rank 2: reduce #0 "
                                      "(count 10, fp32, root 1)"))
        << roots.error;
    for (int r = 0; r < 3; ++r) EXPECT_TRUE(Contains(roots.per_rank[r], "different collectives")) << r;
    EXPECT_LT(roots.seconds, 5.0);
}

TEST(CommThreadFailure, ABadArgumentOnOneRankStopsAll) {
    const Outcome out = run_and_record(2, 60s, [](Communicator& c) {
        std::vector<uint16_t> h(8);
        c.all_reduce(h.data(), h.data(), 8, c.rank() == 1 ? DType::F16 : DType::BF16);
    });
    EXPECT_TRUE(Contains(out.error, "rank 1 of 2 failed: all_reduce (threads communicator, rank 1 of 2): sums are "
                                    "implemented for fp32 and bf16, got fp16"));
}

TEST(CommThreadFailure, NonStandardExceptionsAreReportedToo) {
    const Outcome out = run_and_record(2, 60s, [](Communicator& c) {
        if (c.rank() == 1) throw 7;
        c.barrier();
    });
    EXPECT_TRUE(Contains(out.error, "rank 1 of 2 failed: an exception that is not a std::exception"));
}

TEST(CommThreadFailure, OneCommunicatorPerRank) {
    comm::ThreadWorld world(2);
    auto first = comm::make_thread_communicator(world, 1);
    EXPECT_ERROR(comm::make_thread_communicator(world, 1), "rank 1 already has a communicator");
    EXPECT_ERROR(comm::make_thread_communicator(world, 2), "rank 2 is not in a world of 2");
    EXPECT_ERROR(comm::ThreadWorld(0), "world size must be at least 1");
}

}  // namespace
}  // namespace qtrain::test
