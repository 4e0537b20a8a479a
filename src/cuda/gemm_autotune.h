// --gemm-autotune, for one GEMM shape: cuBLASLt's candidate algorithms are tried in turn on the
// step's own calls, each call timed with a pair of CUDA events that is read later without waiting.
// Each candidate's first call is not counted (it also pays for loading the kernel); once every
// candidate has kSamples further timings, the fastest (best of its timings) wins, the heuristic's
// order breaking ties within 2%. A 24-layer model times 8 candidates within its first step; a shape
// called once per step, like the LM head, needs candidates x (kSamples + 1) steps.
// Timing in place rather than in a side benchmark matters: candidates timed alone, back to back on
// operands sitting in L2, ranked differently from the step. In one measurement on the H200 such
// offline choices were 7.6% faster in isolation and made the bf16 0.5B step 1.6% slower.
// Internal to cuda/gemm.cpp (the only user of cuBLASLt types).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <vector>

#include "cuda/gemm.h"

namespace qtrain::detail {

class AlgoTrials {
public:
    static constexpr int kSamples = GemmRunner::kAutotuneSamples;

    explicit AlgoTrials(std::vector<cublasLtMatmulAlgo_t> candidates);
    ~AlgoTrials();
    AlgoTrials(const AlgoTrials&) = delete;
    AlgoTrials& operator=(const AlgoTrials&) = delete;

    // Collects the timings that have finished (never blocks). True once every candidate that runs
    // these operands has kSamples of them: then best() is the choice.
    bool decided();
    int best() const;
    double best_ms(int candidate) const;  // < 0: refused these operands, or not timed
    int size() const { return static_cast<int>(candidates_.size()); }
    const cublasLtMatmulAlgo_t& candidate(int i) const { return candidates_[i]; }

    // One real call with the next candidate to time. `launch(algo)` runs the product and returns
    // whether cuBLASLt accepted the algorithm; a refused candidate is dropped and the call is made
    // with the heuristic's first choice instead (which must work: cuBLASLt offered it first).
    template <class Launch>
    bool run(Launch&& launch, cudaStream_t stream) {
        const int c = next_candidate();
        Pending p{c, take_event(), take_event()};
        check(cudaEventRecord(p.start, stream));
        if (!launch(candidates_[c])) {
            refused_[c] = true;
            give_back(p);
            return launch(candidates_[0]);
        }
        check(cudaEventRecord(p.stop, stream));
        pending_.push_back(p);
        ++in_flight_[c];
        return true;
    }

private:
    struct Pending {
        int candidate;
        cudaEvent_t start, stop;
    };
    int next_candidate() const;
    cudaEvent_t take_event();
    void give_back(const Pending& p);
    static void check(cudaError_t e);

    std::vector<cublasLtMatmulAlgo_t> candidates_;
    std::vector<double> best_ms_;
    std::vector<int> samples_, in_flight_;
    std::vector<bool> refused_, warmed_;
    std::vector<Pending> pending_;
    std::vector<cudaEvent_t> free_events_, all_events_;
};

}  // namespace qtrain::detail
