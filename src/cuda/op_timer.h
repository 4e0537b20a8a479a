// Per-op-family GPU time, for finding where a step's time goes (PERF.md: "how to know where you
// are"). Enabled by the environment variable QTRAIN_TIME_BREAKDOWN=1: every op records CUDA events
// around itself; at each collect() (after the step's sync) the elapsed times are summed per family,
// and print() shows the table. Disabled, a scope costs one branch.
// Besides the families, each step's span (its first scope's start to its last scope's end, over every
// stream) and the time inside at least one scope (the union of the intervals): span - busy is when no
// timed op ran (idle GPU, or work outside any scope). A family's time is its scopes' own time: a scope
// opened inside another on the same stream ("gemm fwd" inside "recompute") is taken out of the outer
// one, so no instant of a stream counts twice; side-stream scopes (host copies) still overlap the
// compute stream's, so the sum of the families can exceed the busy time, which counts each instant once.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

namespace qtrain {

// Total length covered by the intervals [first, second) (overlaps counted once); any order.
double covered_length(std::vector<std::pair<double, double>> intervals);

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
    // Summed over the collected steps (see the top): first scope's start to last scope's end; inside a scope.
    double span_ms() const { return span_ms_; }
    double busy_ms() const { return busy_ms_; }
    double sum_ms() const;  // every family's total

private:
    friend class Scope;
    bool enabled_ = false;
    std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
    std::vector<const char*> names_;
    std::vector<int> parent_;  // per slot: the scope it was opened in on the same stream, or -1
    std::vector<cudaStream_t> streams_;
    std::vector<int> open_;    // the scopes open now, innermost last
    std::size_t used_ = 0;
    std::map<std::string, double> total_ms_;
    double span_ms_ = 0, busy_ms_ = 0;  // summed over the collected steps
    int steps_ = 0;
    bool warmed_up_ = false;
};

}  // namespace qtrain
