#include "cuda/op_timer.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/check.h"

namespace qtrain {

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
    }
    slot_ = static_cast<int>(t_->used_++);
    t_->names_[slot_] = name;
    CUDA_CHECK(cudaEventRecord(t_->events_[slot_].first, s_));
}

OpTimer::Scope::~Scope() {
    if (t_) cudaEventRecord(t_->events_[slot_].second, s_);
}

void OpTimer::collect() {
    if (!enabled_) return;
    for (std::size_t i = 0; i < used_; ++i) {
        float ms = 0;
        CUDA_CHECK(cudaEventSynchronize(events_[i].second));
        CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i].first, events_[i].second));
        if (warmed_up_) total_ms_[names_[i]] += ms;  // the first step pays one-off costs (heuristics)
    }
    used_ = 0;
    if (warmed_up_) ++steps_;
    warmed_up_ = true;
}

std::string OpTimer::report() const {
    double sum = 0;
    for (const auto& [k, v] : total_ms_) sum += v;
    std::string out = "[Time breakdown] GPU ms per step by op family\n";
    char line[160];
    for (const auto& [k, v] : total_ms_) {
        std::snprintf(line, sizeof line, "  %-22s %9.3f ms  %5.1f%%\n", k.c_str(), v / std::max(1, steps_),
                      sum > 0 ? 100.0 * v / sum : 0.0);
        out += line;
    }
    std::snprintf(line, sizeof line, "  %-22s %9.3f ms\n", "sum of ops", sum / std::max(1, steps_));
    out += line;
    return out;
}

}  // namespace qtrain
