// Per-op-family GPU time, for finding where a step's time goes (PERF.md: "how to know where you
// are"). Enabled by the environment variable QTRAIN_TIME_BREAKDOWN=1: every op records CUDA events
// around itself; at each collect() (after the step's sync) the elapsed times are summed per family,
// and print() shows the table. Disabled, a scope costs one branch.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

namespace qtrain {

class OpTimer {
public:
    OpTimer();
    ~OpTimer();
    bool enabled() const { return enabled_; }

    class Scope {
    public:
        Scope(OpTimer* t, const char* name, cudaStream_t s);
        ~Scope();
        Scope(const Scope&) = delete;
        Scope& operator=(const Scope&) = delete;

    private:
        OpTimer* t_;
        int slot_ = -1;
        cudaStream_t s_;
    };
    Scope scope(const char* name, cudaStream_t s) { return Scope(enabled_ ? this : nullptr, name, s); }

    // Adds the recorded intervals to the totals (call after the stream is synchronised).
    void collect();
    // Table of ms per step by family, with shares; `steps` = how many steps were collected.
    std::string report() const;
    int steps() const { return steps_; }

private:
    friend class Scope;
    bool enabled_ = false;
    std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
    std::vector<const char*> names_;
    std::size_t used_ = 0;
    std::map<std::string, double> total_ms_;
    int steps_ = 0;
    bool warmed_up_ = false;
};

}  // namespace qtrain
