#include "train/progress_watchdog.h"

#include <utility>

namespace qtrain {

ProgressWatchdog::ProgressWatchdog(std::chrono::milliseconds timeout,
                                   std::function<void(const std::string&, double)> on_expiry)
    : timeout_(timeout), on_expiry_(std::move(on_expiry)) {
    if (timeout_.count() > 0) thread_ = std::thread([this] { watch(); });
}

ProgressWatchdog::~ProgressWatchdog() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void ProgressWatchdog::arm(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    what_ = what;
    since_ = std::chrono::steady_clock::now();
    cv_.notify_all();
}

void ProgressWatchdog::feed() {
    std::lock_guard<std::mutex> lock(mu_);
    since_ = std::chrono::steady_clock::now();
}

void ProgressWatchdog::disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
}

void ProgressWatchdog::watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
        if (!armed_) {
            cv_.wait(lock, [&] { return stop_ || armed_; });
            continue;
        }
        const auto deadline = since_ + timeout_;
        if (std::chrono::steady_clock::now() < deadline) {
            // woken early by arm/stop, or the deadline moved (feed): look again
            cv_.wait_until(lock, deadline);
            continue;
        }
        if (fired_) return;
        fired_ = true;
        const std::string what = what_;
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
        lock.unlock();
        on_expiry_(what, seconds);  // normally ends the process
        return;
    }
}

}  // namespace qtrain
