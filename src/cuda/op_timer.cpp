#include "cuda/op_timer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/check.h"

namespace qtrain {

double covered_length(std::vector<std::pair<double, double>> iv) {
    std::sort(iv.begin(), iv.end());
    double total = 0, start = 0, end = 0;
    bool open = false;
    for (const auto& [a, b] : iv) {
        if (b <= a) continue;
        if (open && a <= end) {
            end = std::max(end, b);
            continue;
        }
        if (open) total += end - start;
        start = a;
        end = b;
        open = true;
    }
    if (open) total += end - start;
    return total;
}

OpTimer::OpTimer() {
    const char* env = std::getenv("QTRAIN_TIME_BREAKDOWN");
    enabled_ = env && std::strcmp(env, "0") != 0 && *env;
}

OpTimer::~OpTimer() {
    for (auto& [a, b] : events_) {
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
}

OpTimer::Scope::Scope(OpTimer* t, const char* name, cudaStream_t s) : t_(t), s_(s) {
    if (!t_) return;
    if (t_->used_ == t_->events_.size()) {
        cudaEvent_t a, b;
        CUDA_CHECK(cudaEventCreate(&a));
        CUDA_CHECK(cudaEventCreate(&b));
        t_->events_.emplace_back(a, b);
        t_->names_.push_back(name);
        t_->parent_.push_back(-1);
        t_->streams_.push_back(nullptr);
    }
    slot_ = static_cast<int>(t_->used_++);
    t_->names_[slot_] = name;
    t_->streams_[slot_] = s_;
    t_->parent_[slot_] = -1;  // the innermost open scope on the same stream
    for (auto it = t_->open_.rbegin(); it != t_->open_.rend(); ++it)
        if (t_->streams_[*it] == s_) {
            t_->parent_[slot_] = *it;
            break;
        }
    CUDA_CHECK(cudaEventRecord(t_->events_[slot_].first, s_));
    t_->open_.push_back(slot_);  // (after the record: a throw leaves no dead scope open)
}

OpTimer::Scope::~Scope() {
    if (!t_) return;
    cudaEventRecord(t_->events_[slot_].second, s_);
    for (auto it = t_->open_.end(); it != t_->open_.begin();)
        if (*--it == slot_) {
            t_->open_.erase(it);
            break;
        }
}

void OpTimer::collect() {
    if (!enabled_) return;
    // each interval against the step's first scope's start (elapsed times between events of different
    // streams are valid; one recorded before the reference gives a negative time)
    std::vector<std::pair<double, double>> iv;
    std::vector<double> self(used_, 0.0);  // each scope's time less its nested scopes' on its stream
    for (std::size_t i = 0; i < used_; ++i) {
        float ms = 0;
        CUDA_CHECK(cudaEventSynchronize(events_[i].second));
        CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i].first, events_[i].second));
        self[i] += ms;
        if (parent_[i] >= 0) self[parent_[i]] -= ms;
    }
    double lo = 0, hi = 0;
    for (std::size_t i = 0; i < used_; ++i) {
        float a = 0, b = 0;
        if (warmed_up_) total_ms_[names_[i]] += self[i];  // the first step pays one-off costs (heuristics)
        CUDA_CHECK(cudaEventElapsedTime(&a, events_[0].first, events_[i].first));
        CUDA_CHECK(cudaEventElapsedTime(&b, events_[0].first, events_[i].second));
        iv.emplace_back(a, b);
        lo = i == 0 ? a : std::min<double>(lo, a);
        hi = i == 0 ? b : std::max<double>(hi, b);
    }
    if (warmed_up_ && used_ > 0) {
        span_ms_ += hi - lo;
        busy_ms_ += covered_length(std::move(iv));
    }
    used_ = 0;
    if (warmed_up_) ++steps_;
    warmed_up_ = true;
}

double OpTimer::sum_ms() const {
    double sum = 0;
    for (const auto& [k, v] : total_ms_) sum += v;
    return sum;
}

std::string OpTimer::report() const {
    const double sum = sum_ms();
    std::string out = "[Time breakdown] GPU ms per step by op family (own time: nested scopes on the same stream are "
                      "their own families)\n";
    char line[160];
    for (const auto& [k, v] : total_ms_) {
        std::snprintf(line, sizeof line, "  %-22s %9.3f ms  %5.1f%%\n", k.c_str(), v / std::max(1, steps_),
                      sum > 0 ? 100.0 * v / sum : 0.0);
        out += line;
    }
    const int n = std::max(1, steps_);
    std::snprintf(line, sizeof line, "  %-22s %9.3f ms  (side-stream scopes overlap the compute stream's)\n",
                  "sum of ops", sum / n);
    out += line;
    std::snprintf(line, sizeof line, "  %-22s %9.3f ms  (first scope's start to last scope's end)\n", "step span",
                  span_ms_ / n);
    out += line;
    std::snprintf(line, sizeof line, "  %-22s %9.3f ms  %5.1f%% of the span (no timed op running on any stream)\n",
                  "idle or untimed", (span_ms_ - busy_ms_) / n, span_ms_ > 0 ? 100.0 * (span_ms_ - busy_ms_) / span_ms_ : 0.0);
    out += line;
    return out;
}

}  // namespace qtrain
