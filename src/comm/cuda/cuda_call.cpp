#include "comm/cuda/cuda_call.h"

#include "core/error.h"

namespace qtrain::comm {

void throw_comm_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
    cudaGetLastError();  // clears a non-sticky error, so it does not surface again at the next check
    throw Error(cat("CUDA error in ", call, " (", file, ":", line, "): ", cudaGetErrorName(err), ": ",
                    cudaGetErrorString(err)));
}

int visible_cuda_devices() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // the "no driver / no device" error is not sticky; clear it
        return 0;
    }
    return n;
}

void require_stream_on(cudaStream_t stream, int device, const char* op, const std::string& what) {
#if CUDART_VERSION >= 12080
    // cudaStreamGetDevice is not permitted on a capturing stream (cudaErrorStreamCaptureUnsupported,
    // seen on the H200 with CUDA 13.0): a captured call was checked when the stream ran eagerly
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    QT_COMM_CUDA(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return;
    int stream_device = -1;
    QT_COMM_CUDA(cudaStreamGetDevice(stream, &stream_device));
    QT_CHECK(stream_device == device, op, " (", what, "): the stream belongs to CUDA device ", stream_device,
             ", not to this rank's device ", device);
#else
    (void)stream, (void)device, (void)op, (void)what;
#endif
}

DeviceScope::DeviceScope(int device) {
    int current = -1;
    QT_COMM_CUDA(cudaGetDevice(&current));
    if (current == device) return;
    QT_COMM_CUDA(cudaSetDevice(device));
    previous_ = current;
}

DeviceScope::~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);  // a destructor must not throw; nothing to do on failure
}

}  // namespace qtrain::comm
