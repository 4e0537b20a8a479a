#include "cuda/gemm_autotune.h"

#include <algorithm>
#include <utility>

#include "cuda/check.h"

namespace qtrain::detail {

AlgoTrials::AlgoTrials(std::vector<cublasLtMatmulAlgo_t> candidates)
    : candidates_(std::move(candidates)),
      best_ms_(candidates_.size(), 0.0),
      samples_(candidates_.size(), 0),
      in_flight_(candidates_.size(), 0),
      refused_(candidates_.size(), false),
      warmed_(candidates_.size(), false) {}

AlgoTrials::~AlgoTrials() {
    for (cudaEvent_t e : all_events_) cudaEventDestroy(e);
}

void AlgoTrials::check(cudaError_t e) { CUDA_CHECK(e); }

cudaEvent_t AlgoTrials::take_event() {
    if (free_events_.empty()) {
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreate(&e));
        all_events_.push_back(e);
        return e;
    }
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
}

void AlgoTrials::give_back(const Pending& p) {
    free_events_.push_back(p.start);
    free_events_.push_back(p.stop);
}

// The candidate with the fewest timings (finished or in flight), the heuristic's order first.
int AlgoTrials::next_candidate() const {
    int pick = -1, fewest = 0;
    for (int i = 0; i < size(); ++i) {
        if (refused_[i]) continue;
        const int n = samples_[i] + in_flight_[i] + (warmed_[i] ? 0 : -1);  // a warm-up call counts as -1
        if (pick < 0 || n < fewest) pick = i, fewest = n;
    }
    return pick < 0 ? 0 : pick;
}

bool AlgoTrials::decided() {
    for (std::size_t i = 0; i < pending_.size();) {
        const Pending& p = pending_[i];
        const cudaError_t st = cudaEventQuery(p.stop);
        if (st == cudaErrorNotReady) {
            ++i;
            continue;
        }
        CUDA_CHECK(st);
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, p.start, p.stop));
        // A candidate's first call also pays for loading its kernel (lazy module loading): not counted.
        if (warmed_[p.candidate]) {
            best_ms_[p.candidate] = samples_[p.candidate] == 0 ? ms : std::min<double>(best_ms_[p.candidate], ms);
            ++samples_[p.candidate];
        }
        warmed_[p.candidate] = true;
        --in_flight_[p.candidate];
        give_back(p);
        pending_[i] = pending_.back();
        pending_.pop_back();
    }
    for (int i = 0; i < size(); ++i)
        if (!refused_[i] && samples_[i] < kSamples) return false;
    return true;
}

double AlgoTrials::best_ms(int c) const { return refused_[c] || samples_[c] == 0 ? -1.0 : best_ms_[c]; }

int AlgoTrials::best() const {
    double fastest = -1.0;
    for (int i = 0; i < size(); ++i)
        if (best_ms(i) > 0 && (fastest < 0 || best_ms(i) < fastest)) fastest = best_ms(i);
    for (int i = 0; i < size(); ++i)
        if (best_ms(i) > 0 && best_ms(i) <= fastest * 1.02) return i;
    return 0;
}

}  // namespace qtrain::detail
