#include "cuda/device.h"

#include <cuda_runtime.h>

#include "cuda/check.h"

namespace qtrain {

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky "no driver/device" error
        return 0;
    }
    return n;
}

GpuInfo cuda_device_info(int index) {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    GpuInfo g;
    g.index = index;
    g.name = prop.name;
    g.sm_count = prop.multiProcessorCount;
    int clock_khz = 0;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, index) != cudaSuccess) (void)cudaGetLastError();
    g.clock_mhz = clock_khz / 1000;
    g.cc_major = prop.major;
    g.cc_minor = prop.minor;
    g.total_memory = prop.totalGlobalMem;
    int current = 0;
    CUDA_CHECK(cudaGetDevice(&current));
    CUDA_CHECK(cudaSetDevice(index));
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    CUDA_CHECK(cudaSetDevice(current));
    g.free_memory = free_b;
    return g;
}

}  // namespace qtrain
