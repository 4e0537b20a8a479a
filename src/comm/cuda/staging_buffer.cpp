#include "comm/cuda/staging_buffer.h"

#include "comm/cuda/cuda_call.h"
#include "core/error.h"

namespace qtrain::comm {
namespace {

// Rounded up to 2 MiB, so a bucket a little larger than the last does not allocate again.
constexpr std::size_t kGranule = std::size_t{2} << 20;

std::size_t rounded(std::size_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; }

}  // namespace

StagingBuffer::StagingBuffer(int device, std::string owner) : device_(device), owner_(std::move(owner)) {}

StagingBuffer::~StagingBuffer() {
    if (!ptr_ && retired_.empty()) return;
    // Queued collectives may still read the buffers: wait for the device before freeing them.
    // Errors are ignored (a destructor must not throw, and a failed device has nothing left to free).
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    cudaDeviceSynchronize();
    for (void* p : retired_) cudaFree(p);
    if (ptr_) cudaFree(ptr_);
    if (previous >= 0) cudaSetDevice(previous);
}

void StagingBuffer::grow(std::size_t bytes) {
    const std::size_t size = rounded(bytes);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, size);
    if (err != cudaSuccess) {
        cudaGetLastError();
        throw Error(cat(owner_, ": cannot allocate ", size, " bytes of staging on CUDA device ", device_, ": ",
                        cudaGetErrorString(err), " (the staging holds the peers' blocks of a sum: ",
                        "world - 1 blocks of the largest reduce-scatter block or all-reduce share)"));
    }
    if (ptr_) retired_.push_back(ptr_);
    ptr_ = p;
    bytes_ = size;
}

void StagingBuffer::reserve(std::size_t bytes) {
    DeviceScope scope(device_);
    if (bytes > bytes_) grow(bytes);
    if (!retired_.empty()) {
        QT_COMM_CUDA(cudaDeviceSynchronize());
        for (void* p : retired_) QT_COMM_CUDA(cudaFree(p));
        retired_.clear();
    }
}

void* StagingBuffer::get(std::size_t bytes, cudaStream_t stream) {
    if (bytes <= bytes_) return ptr_;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    QT_COMM_CUDA(cudaStreamIsCapturing(stream, &capture));
    QT_CHECK(capture == cudaStreamCaptureStatusNone, owner_, ": this collective needs ", bytes,
             " bytes of staging but has ", bytes_, ", and its stream is capturing a CUDA graph, where the "
             "staging cannot grow (cudaMalloc is not capturable): reserve() it before capturing");
    DeviceScope scope(device_);
    grow(bytes);
    return ptr_;
}

}  // namespace qtrain::comm
