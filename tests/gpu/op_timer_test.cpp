// The op timer's step span and busy time (cuda/op_timer.h): the union of scope intervals (CPU) and,
// on a GPU, scopes on two streams with a gap between them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <chrono>
#include <string>
#include <thread>

#include "cuda/op_timer.h"
#include "gpu_test_util.h"

using namespace qtrain;

TEST(OpTimerCoveredLength, OverlapsCountOnceAndGapsNotAtAll) {
    EXPECT_DOUBLE_EQ(covered_length({}), 0.0);
    EXPECT_DOUBLE_EQ(covered_length({{0, 2}}), 2.0);
    EXPECT_DOUBLE_EQ(covered_length({{0, 2}, {1, 3}}), 3.0);             // overlap
    EXPECT_DOUBLE_EQ(covered_length({{5, 6}, {0, 2}, {1, 3}}), 4.0);     // any order, a gap [3, 5)
    EXPECT_DOUBLE_EQ(covered_length({{0, 10}, {2, 3}, {4, 5}}), 10.0);  // nested
    EXPECT_DOUBLE_EQ(covered_length({{-2, -1}, {0, 1}}), 2.0);          // before the reference
    EXPECT_DOUBLE_EQ(covered_length({{1, 1}, {3, 2}}), 0.0);            // empty and reversed count nothing
    EXPECT_DOUBLE_EQ(covered_length({{0, 1}, {1, 2}}), 2.0);            // touching
}

namespace {

// Memsets enough bytes to take ~a millisecond (the timer's resolution is ~0.5 us).
void busy(void* p, std::size_t n, cudaStream_t s) {
    for (int i = 0; i < 8; ++i) CUDA_CHECK(cudaMemsetAsync(p, i, n, s));
}

// Holds the stream for a fixed 3 ms of wall time (a host function the stream waits for): unlike a memset,
// its length does not depend on the GPU's clocks, which ramp up from idle within a step (on the H200 a
// step's first round of memsets took 0.84 ms, the next ones 0.55).
void hold(cudaStream_t s) {
    CUDA_CHECK(cudaLaunchHostFunc(
        s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(3)); }, nullptr));
}

}  // namespace

// An enabled timer (QTRAIN_TIME_BREAKDOWN=1 while it is made), two 256 MiB buffers and two streams.
class OpTimerSpan : public ::testing::Test {
protected:
    void SetUp() override {
        QTRAIN_REQUIRE_GPU();
        setenv("QTRAIN_TIME_BREAKDOWN", "1", 1);
        timer = std::make_unique<OpTimer>();
        unsetenv("QTRAIN_TIME_BREAKDOWN");
        ASSERT_TRUE(timer->enabled());
        CUDA_CHECK(cudaMalloc(&a, n));
        CUDA_CHECK(cudaMalloc(&b, n));
        CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
        CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    }
    void TearDown() override {
        if (s1) cudaStreamDestroy(s1);
        if (s2) cudaStreamDestroy(s2);
        if (a) cudaFree(a);
        if (b) cudaFree(b);
    }
    const std::size_t n = std::size_t{256} << 20;
    std::unique_ptr<OpTimer> timer;
    void *a = nullptr, *b = nullptr;
    cudaStream_t s1 = nullptr, s2 = nullptr;
};

TEST_F(OpTimerSpan, IdleIsTheSpanLessTheTimeInsideAnyScope) {
    OpTimer& timer = *this->timer;
    for (int step = 0; step < 3; ++step) {  // the first step is the timer's warm-up (not counted)
        {
            auto t = timer.scope("first", s1);
            busy(a, n, s1);
        }
        {
            auto t = timer.scope("beside", s2);  // on another stream, at the same time
            busy(b, n, s2);
        }
        CUDA_CHECK(cudaStreamSynchronize(s1));
        CUDA_CHECK(cudaStreamSynchronize(s2));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a gap no scope covers
        {
            auto t = timer.scope("after the gap", s1);
            busy(a, n, s1);
        }
        CUDA_CHECK(cudaStreamSynchronize(s1));
        timer.collect();
    }
    EXPECT_EQ(timer.steps(), 2);
    EXPECT_GT(timer.span_ms(), 2 * 20.0);                     // the gaps are inside the span
    EXPECT_LT(timer.busy_ms(), timer.span_ms() - 2 * 19.0);   // and not in the busy time
    EXPECT_LE(timer.busy_ms(), timer.sum_ms() + 1e-3);        // overlapping scopes counted once
    EXPECT_GT(timer.busy_ms(), 0.0);
    EXPECT_NE(timer.report().find("idle or untimed"), std::string::npos);
}

// A scope inside another on the same stream is the outer one's minus: the families' sum then counts no
// instant of a stream twice ("gemm fwd" inside "recompute"). One on another stream is not taken out.
TEST_F(OpTimerSpan, NestedScopesOnOneStreamAreTakenOutOfTheOuter) {
    OpTimer& timer = *this->timer;
    for (int step = 0; step < 2; ++step) {
        {
            auto outer = timer.scope("outer", s1);
            hold(s1);
            {
                auto inner = timer.scope("inner", s1);
                hold(s1);
                hold(s1);
            }
            auto side = timer.scope("side", s2);  // opened inside, on another stream
            busy(b, n, s2);
        }
        CUDA_CHECK(cudaStreamSynchronize(s1));
        CUDA_CHECK(cudaStreamSynchronize(s2));
        timer.collect();
    }
    const std::string r = timer.report();
    // outer's own time is one 3 ms hold, inner's two: inner > outer here, and their sum is the stream's
    // busy time on s1 (not outer's full interval counted again)
    auto ms_of = [&](const std::string& name) {
        const std::size_t at = r.find("  " + name + " ");
        EXPECT_NE(at, std::string::npos) << r;
        return at == std::string::npos ? 0.0 : std::stod(r.substr(at + 2 + 22, 10));
    };
    const double outer = ms_of("outer"), inner = ms_of("inner"), side = ms_of("side");
    EXPECT_GT(outer, 2.9) << r;  // per step (the sleeps are at least 3 ms; their wake-ups only add)
    EXPECT_GT(inner, 1.5 * outer) << r;
    EXPECT_LT(inner, 2.5 * outer) << r;
    EXPECT_GT(side, 0.0);
    EXPECT_LE(timer.sum_ms(), timer.busy_ms() + side + 1e-3) << r;  // only the side stream's overlap is counted twice
}
