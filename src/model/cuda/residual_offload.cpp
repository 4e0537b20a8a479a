#include "model/cuda/residual_offload.h"

#include "core/error.h"
#include "cuda/check.h"

namespace qtrain {

ResidualOffload::ResidualOffload(void* host, void* const slots[2], std::size_t layer_bytes, cudaStream_t compute)
    : host_(host), slots_{slots[0], slots[1]}, bytes_(layer_bytes), compute_(compute) {
    if (!enabled()) return;
    stream_ = cuda::Stream::non_blocking();
    for (int s = 0; s < 2; ++s)
        for (cuda::Event* e : {&written_[s], &saved_[s], &free_[s], &loaded_[s]}) *e = cuda::Event::ordering();
}

ResidualOffload::~ResidualOffload() {
    if (stream_) cudaStreamSynchronize(stream_);
}

void ResidualOffload::before_write(int l) {
    if (!enabled()) return;
    CUDA_CHECK(cudaStreamWaitEvent(compute_, saved_[l & 1], 0));
}

void ResidualOffload::written(int l) {
    if (!enabled()) return;
    const int s = l & 1;
    CUDA_CHECK(cudaEventRecord(written_[s], compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, written_[s], 0));
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(host_) + l * bytes_, slots_[s], bytes_, cudaMemcpyDefault, stream_));
    CUDA_CHECK(cudaEventRecord(saved_[s], stream_));
    slot_layer_[s] = l;
}

void ResidualOffload::load(int l) {
    if (!enabled() || l < 0) return;
    const int s = l & 1;
    if (slot_layer_[s] == l) return;  // still there (the two layers at the turn)
    // everything queued so far on the compute stream is all that reads the slot's current layer
    CUDA_CHECK(cudaEventRecord(free_[s], compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, free_[s], 0));
    CUDA_CHECK(cudaMemcpyAsync(slots_[s], static_cast<const char*>(host_) + l * bytes_, bytes_, cudaMemcpyDefault,
                               stream_));
    CUDA_CHECK(cudaEventRecord(loaded_[s], stream_));
    slot_layer_[s] = l;
}

void ResidualOffload::get(int l) {
    if (!enabled()) return;
    QT_CHECK(slot_layer_[l & 1] == l, "residual offload: internal error (layer ", l, " is not in its slot)");
    CUDA_CHECK(cudaStreamWaitEvent(compute_, loaded_[l & 1], 0));
}

}  // namespace qtrain
