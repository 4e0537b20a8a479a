// The threads backend against the sequential rank-order reference (collective_checks.h), at world
// sizes 1 to 4, bit for bit.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "collective_checks.h"
#include "comm/run_ranks.h"

namespace qtrain::test {
namespace {

class CommThreads : public ::testing::TestWithParam<int> {};

TEST_P(CommThreads, EqualTheRankOrderReferenceBitForBit) {
    const int world = GetParam();
    std::vector<CheckLog> logs(static_cast<std::size_t>(world));
    comm::run_ranks(world, [&](Communicator& c) { logs[static_cast<std::size_t>(c.rank())] = check_everything(c, 42); });
    for (int r = 0; r < world; ++r) {
        EXPECT_GT(logs[r].checks, 150) << "rank " << r << " ran too few checks";
        for (const auto& f : logs[r].failures) ADD_FAILURE() << f;
    }
}

// The reference is only a test of the order if the data make the order matter: with 3+ ranks a sum
// in reverse order must differ in many elements (with 2, a + b == b + a, so only blocks can be wrong).
TEST_P(CommThreads, TestDataMakeTheSummationOrderMatter) {
    const int world = GetParam();
    if (world < 3) GTEST_SKIP() << "order cannot matter for " << world << " rank(s)";
    EXPECT_GT(order_sensitive(world_data(42, world, 1237)), 50u);
}

// After a barrier, every rank's writes from before it are visible to every rank.
TEST_P(CommThreads, BarrierOrdersWrites) {
    const int world = GetParam();
    std::vector<std::atomic<int>> marks(static_cast<std::size_t>(world));
    std::atomic<int> wrong{0};
    comm::run_ranks(world, [&](Communicator& c) {
        for (int round = 1; round <= 50; ++round) {
            marks[static_cast<std::size_t>(c.rank())].store(round, std::memory_order_relaxed);
            c.barrier();
            for (auto& m : marks)
                if (m.load(std::memory_order_relaxed) < round) ++wrong;
            c.barrier();  // nobody starts the next round while a peer still reads this one's marks
        }
    });
    EXPECT_EQ(wrong.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Worlds, CommThreads, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace qtrain::test
