// The GPUs this process can see. Plain C++ over the CUDA runtime, so callers need no CUDA headers.
#pragma once

#include <cstdint>
#include <string>

namespace qtrain {

struct GpuInfo {
    int index = 0;
    std::string name;
    int sm_count = 0;
    int clock_mhz = 0;
    int cc_major = 0, cc_minor = 0;
    uint64_t total_memory = 0;
    uint64_t free_memory = 0;
};

// Number of usable GPUs; 0 when there is no driver or no device (never throws).
int cuda_device_count();
GpuInfo cuda_device_info(int index);

}  // namespace qtrain
