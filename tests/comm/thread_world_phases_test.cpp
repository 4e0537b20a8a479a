// What the GPU backends add to the ThreadWorld and run_ranks (src/comm/cuda/ builds on them): the
// opaque handle each rank publishes with its call (and what it points at, kept until the world ends), the extra meeting inside a collective
// (meet_within) with the world's failure semantics, and run_ranks over another backend's communicators.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/run_ranks.h"
#include "comm/thread_communicator.h"
#include "test_util.h"

namespace qtrain::test {
namespace {

using comm::ThreadWorld;
using namespace std::chrono_literals;

ThreadWorld::Call call_with(const void* handle) {
    ThreadWorld::Call c;
    c.op = ThreadWorld::Op::AllReduce;
    c.count = 5;
    c.dtype = DType::F32;
    c.handle = handle;
    return c;
}

TEST(CommThreadWorldPhases, EveryRankSeesEveryRanksHandleThroughAllMeetings) {
    constexpr int kWorld = 3;
    ThreadWorld world(kWorld, 30s);
    int token[kWorld] = {10, 11, 12};
    std::vector<std::vector<const void*>> seen(kWorld);
    std::vector<std::string> errors(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r)
        threads.emplace_back([&, r] {
            try {
                for (int round = 0; round < 4; ++round) {
                    const ThreadWorld::Call call = call_with(&token[r]);
                    const auto& calls = world.arrive(r, call);
                    world.meet_within(r, call, "shares summed");
                    for (const auto& c : calls) seen[r].push_back(c.handle);  // still valid after meet_within
                    world.depart(r, call);
                }
            } catch (const std::exception& e) {
                errors[r] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < kWorld; ++r) {
        EXPECT_EQ(errors[r], "");
        ASSERT_EQ(seen[r].size(), 4u * kWorld);
        for (std::size_t i = 0; i < seen[r].size(); ++i) EXPECT_EQ(seen[r][i], &token[i % kWorld]);
    }
}

TEST(CommThreadWorldPhases, ARankFailingBetweenMeetingsStopsThoseInMeetWithin) {
    ThreadWorld world(3, 60s);
    std::vector<std::string> errors(3);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r)
        threads.emplace_back([&, r] {
            try {
                const ThreadWorld::Call call = call_with(nullptr);
                world.arrive(r, call);
                if (r == 1) {
                    std::this_thread::sleep_for(50ms);  // the others wait in meet_within by now
                    world.abort(1, "cudaMemcpyPeerAsync failed");
                    return;
                }
                world.meet_within(r, call, "shares summed");
            } catch (const std::exception& e) {
                errors[r] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    for (int r : {0, 2}) EXPECT_TRUE(Contains(errors[r], "rank 1 of 3 failed: cudaMemcpyPeerAsync failed")) << r;
}

TEST(CommThreadWorldPhases, ATimeoutInMeetWithinNamesThePhase) {
    ThreadWorld world(2, 200ms);
    std::string error;
    std::thread other([&] {
        world.arrive(1, call_with(nullptr));
        std::this_thread::sleep_for(600ms);  // misses the middle meeting
    });
    try {
        const ThreadWorld::Call call = call_with(nullptr);
        world.arrive(0, call);
        world.meet_within(0, call, "shares summed");
    } catch (const Error& e) {
        error = e.what();
    }
    other.join();
    EXPECT_TRUE(Contains(error, "all_reduce #0 (count 5, fp32), shares summed: rank(s) 1 of 2 did not arrive"));
}

// What a handle points at may be reached by a peer after its rank returned (the copy-engine backend's
// events): the world keeps what it is given until it is itself destroyed, and releases it then.
TEST(CommThreadWorldPhases, KeptResourcesLiveUntilTheWorldIsDestroyed) {
    auto released = std::make_shared<std::atomic<int>>(0);
    {
        ThreadWorld w(2);
        for (int r = 0; r < 2; ++r) {
            std::shared_ptr<int> thing(new int(r), [released](int* p) {
                ++*released;
                delete p;
            });
            w.keep_until_destroyed(thing);
        }  // (the world holds the only references now)
        w.leave(0);
        w.leave(1);
        EXPECT_EQ(released->load(), 0) << "released before the world was destroyed";
    }
    EXPECT_EQ(released->load(), 2);
}

TEST(CommThreadWorldPhases, RunRanksUsesTheGivenCommunicatorsMadeBeforeAnyRankRuns) {
    comm::ThreadWorld world(3);
    std::atomic<int> made{0}, ran{0};
    const auto caller = std::this_thread::get_id();
    comm::run_ranks(
        world,
        [&](ThreadWorld& w, int r) {
            EXPECT_EQ(std::this_thread::get_id(), caller);
            EXPECT_EQ(ran.load(), 0);
            ++made;
            return comm::make_thread_communicator(w, r);
        },
        [&](comm::Communicator& c) {
            ++ran;
            std::vector<float> x(4, 1.0f);
            c.all_reduce(x.data(), x.data(), 4, DType::F32);
            EXPECT_EQ(x[0], 3.0f);
        });
    EXPECT_EQ(made.load(), 3);
    EXPECT_EQ(ran.load(), 3);
    // A factory that fails for one rank fails before any rank runs.
    comm::ThreadWorld other(2);
    EXPECT_ERROR(comm::run_ranks(
                     other,
                     [](ThreadWorld& w, int r) -> std::unique_ptr<comm::Communicator> {
                         if (r == 1) throw Error("no device for rank 1");
                         return comm::make_thread_communicator(w, r);
                     },
                     [&](comm::Communicator&) { ++ran; }),
                 "no device for rank 1");
    EXPECT_EQ(ran.load(), 3);
}

}  // namespace
}  // namespace qtrain::test
