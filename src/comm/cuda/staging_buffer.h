// The device memory a GPU communicator copies its peers' blocks into before summing them: owned by
// the communicator, on its device, reused by every collective.
//
// Size it outside of steps with reserve() (it waits for the device, so it frees a smaller buffer
// safely). A collective that needs more grows it on first use: it allocates the larger buffer and
// keeps the old one (which queued work may still read) until the next reserve() or the destructor,
// so growing never waits for the GPU; but cudaMalloc cannot be captured into a CUDA graph, so a
// stream that is capturing must find the staging big enough (an error says to reserve() first).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

namespace qtrain::comm {

class StagingBuffer {
public:
    // `owner` names the communicator in errors ("copy-engine communicator, rank 1 of 2").
    StagingBuffer(int device, std::string owner);
    ~StagingBuffer();
    StagingBuffer(const StagingBuffer&) = delete;
    StagingBuffer& operator=(const StagingBuffer&) = delete;

    // At least `bytes` from now on; waits for the device (cudaDeviceSynchronize) and frees buffers
    // left over from growing. Call with the device's work of this communicator in a quiet state.
    void reserve(std::size_t bytes);
    // The buffer, at least `bytes` (grown if needed; see above). `stream` is the collective's, only
    // to tell whether it is capturing. Null when bytes is 0 and nothing was ever allocated.
    void* get(std::size_t bytes, cudaStream_t stream);
    std::size_t bytes() const { return bytes_; }

private:
    void grow(std::size_t bytes);

    const int device_;
    const std::string owner_;
    void* ptr_ = nullptr;
    std::size_t bytes_ = 0;
    std::vector<void*> retired_;  // outgrown buffers queued work may still read
};

}  // namespace qtrain::comm
