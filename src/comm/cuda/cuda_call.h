// The GPU communicators' CUDA runtime calls, checked: a failure throws a qtrain::Error naming the
// call, where it is and CUDA's own error string. (The comm layer does not link qtrain_cuda, whose
// CUDA_CHECK does the same for the model's kernels.)
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace qtrain::comm {

[[noreturn]] void throw_comm_cuda_error(cudaError_t err, const char* call, const char* file, int line);

// The CUDA devices this process sees; 0 without a driver or device (never throws).
int visible_cuda_devices();

// Throws a qtrain::Error naming `what` when `stream` (null: the legacy default stream of the current
// device) belongs to another device than `device`: events recorded on it would be on the wrong device.
// (Checked where the runtime can tell, CUDA 12.8 and later.)
void require_stream_on(cudaStream_t stream, int device, const char* op, const std::string& what);

// Makes `device` current for the scope and restores the caller's device after it: a communicator
// works on its own device whichever device the calling thread has current (several ranks may share
// a thread, and the destructor may run on another thread than the rank's).
class DeviceScope {
public:
    explicit DeviceScope(int device);
    ~DeviceScope();
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

private:
    int previous_ = -1;  // -1: nothing to restore
};

}  // namespace qtrain::comm

#define QT_COMM_CUDA(call)                                                                      \
    do {                                                                                        \
        const cudaError_t qt_comm_err_ = (call);                                                \
        if (qt_comm_err_ != cudaSuccess)                                                        \
            ::qtrain::comm::throw_comm_cuda_error(qt_comm_err_, #call, __FILE__, __LINE__);     \
    } while (0)
