// The training loop's watchdog (train/progress_watchdog.h): it fires once, naming the armed work,
// when that work makes no progress for the timeout; feeding or disarming keeps it quiet.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "train/progress_watchdog.h"

using namespace qtrain;
using namespace std::chrono_literals;

namespace {

struct Fired {
    std::atomic<int> count{0};
    std::mutex mu;
    std::string what;
    double seconds = 0;
    auto callback() {
        return [this](const std::string& w, double s) {
            std::lock_guard<std::mutex> lock(mu);
            what = w;
            seconds = s;
            ++count;
        };
    }
};

}  // namespace

TEST(ProgressWatchdog, FiresOnceNamingTheStuckWork) {
    Fired f;
    {
        ProgressWatchdog dog(100ms, f.callback());
        dog.arm("step 7");
        std::this_thread::sleep_for(600ms);
        EXPECT_EQ(f.count.load(), 1);  // once, though it stayed stuck for several timeouts
    }
    EXPECT_EQ(f.what, "step 7");
    EXPECT_GE(f.seconds, 0.1);
    EXPECT_LT(f.seconds, 0.5);
}

TEST(ProgressWatchdog, FeedingAndDisarmingKeepItQuiet) {
    Fired f;
    {
        ProgressWatchdog dog(200ms, f.callback());
        dog.arm("step 1");
        for (int i = 0; i < 8; ++i) {  // 400 ms of work, fed every 50 ms
            std::this_thread::sleep_for(50ms);
            dog.feed();
        }
        dog.disarm();
        std::this_thread::sleep_for(500ms);  // disarmed: a long checkpoint write is not timed
        EXPECT_EQ(f.count.load(), 0);
        {
            WatchdogScope s(&dog, "eval");
            std::this_thread::sleep_for(50ms);
        }
        std::this_thread::sleep_for(400ms);
    }
    EXPECT_EQ(f.count.load(), 0);
}

TEST(ProgressWatchdog, ZeroTimeoutNeverFires) {
    Fired f;
    {
        ProgressWatchdog dog(0ms, f.callback());
        dog.arm("step 1");
        std::this_thread::sleep_for(100ms);
    }
    EXPECT_EQ(f.count.load(), 0);
}
