// The GPU's SM clock and power draw, read through NVML for the benchmarks that ask whether a kernel
// slows down when it runs for seconds rather than milliseconds (the H200 holds its power cap by lowering
// its clock). NVML is opened at run time (dlopen of the driver's libnvidia-ml.so.1), so a benchmark
// still starts where it is missing (a machine without the driver, or `--list` runs on the CPU): the
// readings are then -1. The four entry points are declared here by their documented C signatures;
// the toolkit on the development machine ships no nvml.h.
#pragma once

#include <dlfcn.h>

namespace qtrain::bench {

class GpuClock {
public:
    GpuClock() {
        lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib_) return;
        auto init = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlInit_v2"));
        auto handle = reinterpret_cast<int (*)(unsigned, void**)>(dlsym(lib_, "nvmlDeviceGetHandleByIndex_v2"));
        clock_ = reinterpret_cast<int (*)(void*, int, unsigned*)>(dlsym(lib_, "nvmlDeviceGetClockInfo"));
        power_ = reinterpret_cast<int (*)(void*, unsigned*)>(dlsym(lib_, "nvmlDeviceGetPowerUsage"));
        // NVML's index 0 is CUDA's device 0 on the one-GPU machines these benchmarks run on
        ok_ = init && handle && clock_ && power_ && init() == 0 && handle(0, &device_) == 0;
    }
    ~GpuClock() {
        if (lib_) dlclose(lib_);
    }
    GpuClock(const GpuClock&) = delete;
    GpuClock& operator=(const GpuClock&) = delete;

    bool available() const { return ok_; }
    // the SM clock now, MHz (NVML_CLOCK_SM = 1), or -1
    int sm_mhz() const {
        unsigned v = 0;
        return ok_ && clock_(device_, 1, &v) == 0 ? static_cast<int>(v) : -1;
    }
    // the board's power draw now, watts (NVML reports milliwatts), or -1
    double watts() const {
        unsigned mw = 0;
        return ok_ && power_(device_, &mw) == 0 ? mw / 1000.0 : -1.0;
    }

private:
    void* lib_ = nullptr;
    void* device_ = nullptr;
    bool ok_ = false;
    int (*clock_)(void*, int, unsigned*) = nullptr;
    int (*power_)(void*, unsigned*) = nullptr;
};

}  // namespace qtrain::bench
