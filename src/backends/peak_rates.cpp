#include "backends/peak_rates.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <thread>

namespace qtrain {

double PeakRates::for_matmul(DType t) const {
    switch (t) {
        case DType::E4M3:
        case DType::E5M2: return fp8 > 0 ? fp8 : bf16;
        case DType::BF16:
        case DType::F16: return bf16;
        default: return fp32;
    }
}

PeakRates gpu_peak_rates(const std::string& name, int sm_count, int clock_mhz, int cc_major) {
    struct Known { const char* key; double fp32, bf16, fp8; };  // dense TFLOP/s (tf32 for fp32)
    static constexpr Known kKnown[] = {
        {"H200", 494, 989, 1979}, {"H100 SXM", 494, 989, 1979}, {"H100 80GB HBM3", 494, 989, 1979},
        {"H100 PCIe", 378, 756, 1513}, {"H100", 494, 989, 1979}, {"H800", 494, 989, 1979},
        {"GH200", 494, 989, 1979}, {"A100", 156, 312, 0}, {"A800", 156, 312, 0},
        {"L40S", 183, 362, 733}, {"RTX 4090", 83, 165, 330}, {"RTX 6000 Ada", 91, 182, 364},
        {"RTX PRO 6000", 126, 252, 504}, {"RTX 5090", 105, 209, 419}, {"RTX 3090", 36, 71, 0},
    };
    for (const auto& k : kKnown)
        if (name.find(k.key) != std::string::npos) return {k.fp32 * 1e12, k.bf16 * 1e12, k.fp8 * 1e12};
    // Unknown: dense tensor-core FLOP per clock per SM by generation.
    const double per_sm_clk = cc_major >= 9 ? 1024 : 512;
    const double bf16 = per_sm_clk * sm_count * clock_mhz * 1e6;
    return {bf16 / 2, bf16, cc_major >= 9 ? 2 * bf16 : 0.0};
}

PeakRates cpu_peak_rates(std::string* description) {
    std::ifstream in("/proc/cpuinfo");
    std::string line, model = "CPU";
    double mhz = 0;
    bool avx512 = false, avx2 = false;
    while (std::getline(in, line)) {
        auto value = [&] { auto p = line.find(':'); return p == std::string::npos ? std::string() : line.substr(p + 2); };
        if (line.rfind("model name", 0) == 0) model = value();
        else if (line.rfind("cpu MHz", 0) == 0 && mhz == 0) mhz = std::stod(value());
        else if (line.rfind("flags", 0) == 0) {
            avx512 = line.find(" avx512f") != std::string::npos;
            avx2 = line.find(" avx2") != std::string::npos;
        }
    }
    if (mhz <= 0) mhz = 2000;
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const double flop_per_cycle = avx512 ? 64 : avx2 ? 32 : 8;
    const double fp32 = cores * mhz * 1e6 * flop_per_cycle;
    if (description)
        *description = model + ", " + std::to_string(cores) + " threads @ " + std::to_string(static_cast<int>(mhz)) +
                       " MHz" + (avx512 ? ", AVX-512" : avx2 ? ", AVX2" : "");
    return {fp32, fp32, 0};
}

}  // namespace qtrain
