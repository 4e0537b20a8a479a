// A watchdog on the training loop's progress (issue 19, "a rank that dies or hangs makes every rank
// exit within a bounded time"). The collectives of the host communicators time out on their own
// (thread_world.h, the TCP communicator), but a GPU collective waits in a kernel: a rank whose peer
// died or hangs inside NCCL blocks in cudaStreamSynchronize forever. So the loop arms the watchdog
// for the work that must finish within --comm-timeout (a step, an eval) and feeds it as it goes; if
// the armed loop makes no progress for that long, the watchdog's thread calls `on_expiry` (which
// reports, aborts the communicators and ends the process: nothing on the stuck thread can).
// Disarmed work (loading, checkpoint writes, the export: long and legitimately uneven) is not timed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace qtrain {

class ProgressWatchdog {
public:
    // `on_expiry(what, seconds)`: what the loop was doing (the last arm/feed's label) and how long it has
    // been stuck. Called at most once, on the watchdog's thread. A zero timeout: never expires.
    ProgressWatchdog(std::chrono::milliseconds timeout,
                     std::function<void(const std::string& what, double seconds)> on_expiry);
    ~ProgressWatchdog();
    ProgressWatchdog(const ProgressWatchdog&) = delete;
    ProgressWatchdog& operator=(const ProgressWatchdog&) = delete;

    // Starts (or restarts) the clock for `what`, e.g. "step 12".
    void arm(const std::string& what);
    // Progress within the armed work: the clock starts again.
    void feed();
    // The work is done; nothing is timed until the next arm.
    void disarm();

private:
    void watch();

    const std::chrono::milliseconds timeout_;
    const std::function<void(const std::string&, double)> on_expiry_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool armed_ = false, stop_ = false, fired_ = false;
    std::string what_;
    std::chrono::steady_clock::time_point since_;
    std::thread thread_;
};

// Arms `dog` for the scope (a null dog: nothing).
class WatchdogScope {
public:
    WatchdogScope(ProgressWatchdog* dog, const std::string& what) : dog_(dog) {
        if (dog_) dog_->arm(what);
    }
    ~WatchdogScope() {
        if (dog_) dog_->disarm();
    }
    WatchdogScope(const WatchdogScope&) = delete;
    WatchdogScope& operator=(const WatchdogScope&) = delete;

private:
    ProgressWatchdog* dog_;
};

}  // namespace qtrain
