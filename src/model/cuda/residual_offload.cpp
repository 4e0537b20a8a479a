#include "model/cuda/residual_offload.h"

#include "core/error.h"
#include "cuda/check.h"

namespace qtrain {

ResidualOffload::ResidualOffload(void* host, void* const slots[2], std::size_t layer_bytes, cudaStream_t compute,
                                 OpTimer& timer)
    : host_(host), slots_{slots[0], slots[1]}, bytes_(layer_bytes), compute_(compute), timer_(timer) {
    if (!enabled()) return;
    stream_ = cuda::Stream::non_blocking();
    for (int s = 0; s < 2; ++s)
        for (cuda::PassEvent* e : {&written_[s], &saved_[s], &free_[s], &loaded_[s]}) *e = cuda::PassEvent::ordering();
    joined_ = cuda::Event::ordering();
}

ResidualOffload::~ResidualOffload() {
    if (stream_) cudaStreamSynchronize(stream_);
}

void ResidualOffload::before_write(int l) {
    if (!enabled()) return;
    saved_[l & 1].wait(compute_);
}

void ResidualOffload::written(int l) {
    if (!enabled()) return;
    const int s = l & 1;
    written_[s].record(compute_);
    written_[s].wait(stream_);
    auto t_ = timer_.scope("residual offload", stream_);
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(host_) + l * bytes_, slots_[s], bytes_, cudaMemcpyDefault, stream_));
    saved_[s].record(stream_);
    slot_layer_[s] = l;
}

void ResidualOffload::load(int l) {
    if (!enabled() || l < 0) return;
    const int s = l & 1;
    if (slot_layer_[s] == l) return;  // still there (the two layers at the turn)
    // everything queued so far on the compute stream is all that reads the slot's current layer
    free_[s].record(compute_);
    free_[s].wait(stream_);
    auto t_ = timer_.scope("residual offload", stream_);
    CUDA_CHECK(cudaMemcpyAsync(slots_[s], static_cast<const char*>(host_) + l * bytes_, bytes_, cudaMemcpyDefault,
                               stream_));
    loaded_[s].record(stream_);
    slot_layer_[s] = l;
}

void ResidualOffload::get(int l) {
    if (!enabled()) return;
    QT_CHECK(slot_layer_[l & 1] == l, "residual offload: internal error (layer ", l, " is not in its slot)");
    loaded_[l & 1].wait(compute_);
}

void ResidualOffload::join() {
    if (!enabled()) return;
    cuda::join_into(compute_, stream_, joined_);
    for (int s = 0; s < 2; ++s)
        for (cuda::PassEvent* e : {&written_[s], &saved_[s], &free_[s], &loaded_[s]}) e->settle();
}

}  // namespace qtrain
