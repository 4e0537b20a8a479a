// What the GPU data-parallel tests (data_parallel_test.cpp, reshard_test.cpp) share: ranks as threads
// on one GPU, every weight of a rank's model, bit equality and the per-tensor cosine they compare
// weights with.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/thread_world.h"
#include "gpu_test_util.h"
#include "model/cuda/cuda_model.h"

namespace qtrain::test {

// Every tensor's model-dtype weights of m, concatenated in layout order (collective under ZeRO-3:
// every rank must call it).
inline std::vector<float> all_weights(const CudaModel& m) {
    std::vector<float> out;
    for (const ParamSpec& s : m.layout().specs) {
        auto v = m.download(s.name, CudaModel::Which::Weights);
        out.insert(out.end(), v.begin(), v.end());
    }
    return out;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The smallest cosine over the tensors of `layout` between two concatenated weight sets (where:
// that tensor), leaving out the k_proj biases: their gradient is tiny (without RoPE it would be exactly
// zero, since a key bias adds q.b to every score of a query and the softmax removes it; RoPE's rotation
// leaves only a small position-dependent part), so in bf16 it is mostly rounding noise, which Adam
// scales to full-size steps from their zero start: two runs that round differently move them apart
// (cosine 0.89-0.96 after 10 steps on the H200, also in FP8) while fp32 runs agree to 1.0000000.
// Their smallest cosine goes to *k_bias, not into the result.
inline double worst_weight_cosine(const GpuParamLayout& layout, const std::vector<float>& a,
                                  const std::vector<float>& b, std::string* where, double* k_bias = nullptr) {
    double worst = 1.0, worst_k = 1.0;
    std::size_t at = 0;
    for (const ParamSpec& s : layout.specs) {
        double ab = 0, aa = 0, bb = 0;
        for (int64_t i = 0; i < s.numel(); ++i, ++at) {
            ab += double(a[at]) * b[at];
            aa += double(a[at]) * a[at];
            bb += double(b[at]) * b[at];
        }
        // both zero: equal; one zero or a NaN anywhere: as far apart as can be
        double cos = (aa == 0 || bb == 0) ? (aa == bb ? 1.0 : 0.0) : ab / std::sqrt(aa * bb);
        if (std::isnan(cos)) cos = 0.0;
        if (s.name.find("k_proj.bias") != std::string::npos) {
            worst_k = std::min(worst_k, cos);
            continue;
        }
        if (cos < worst) worst = cos, *where = s.name;
    }
    if (k_bias) *k_bias = worst_k;
    return worst;
}

// Runs fn(rank, communicator) on `world` threads, all on device 0, each with the communicator
// make(rank, world_of_threads) returns; a rank that throws aborts the others' meetings, and the first
// failure is rethrown once every thread has ended.
inline void run_rank_threads(
    int world, const std::function<std::unique_ptr<comm::Communicator>(int, comm::ThreadWorld&)>& make,
    const std::function<void(int, comm::Communicator&)>& fn) {
    comm::ThreadWorld tw(world, std::chrono::milliseconds(120'000));
    std::vector<std::thread> threads;
    std::mutex mu;
    std::exception_ptr first;
    for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] {
            try {
                CUDA_CHECK(cudaSetDevice(0));
                const std::unique_ptr<comm::Communicator> c = make(r, tw);
                fn(r, *c);
                tw.leave(r);
            } catch (const std::exception& e) {
                tw.abort(r, e.what());
                std::lock_guard<std::mutex> lock(mu);
                if (!first) first = std::current_exception();
            }
        });
    for (auto& t : threads) t.join();
    if (first) std::rethrow_exception(first);
}

}  // namespace qtrain::test
