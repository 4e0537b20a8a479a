// The residual-offload role of the GPU model (--offload-residual; docs/design.md, "GPU model roles"):
// each layer's input residual (the one activation --recompute-block keeps per layer) goes to pinned
// host memory on the role's own stream as soon as it is written; the layers share two device slots
// (layer l in slot l % 2), and the backward loads layer l - 1 back while layer l computes (the two
// layers at the turn are still in their slots). Four events per slot order it: written (compute →
// copy out), saved (copy out → the slot may be overwritten), free (the slot's occupant is dead → copy
// in), loaded (copy in → compute). Copies only, so bit-identical. Disabled, every call is a no-op.
// Under CUDA graphs the model calls join() before each pass and at its end (cuda/pass_event.h): the
// copies are then captured as a branch of the step's graph, forked and joined by the same events, and
// the slot bookkeeping below is the same in every pass (the forward writes every layer), so one
// captured pass replays correctly.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "cuda/op_timer.h"
#include "cuda/pass_event.h"
#include "cuda/stream.h"

namespace qtrain {

class ResidualOffload {
public:
    // `host`: every layer's residual, layer l at l * layer_bytes (pinned); `slots`: the two device
    // slots; `compute`: the model's compute stream, which the calls below order against; `timer`: the
    // model's per-op timer (the copies are its "residual offload" scope). Null `host` = disabled.
    ResidualOffload(void* host, void* const slots[2], std::size_t layer_bytes, cudaStream_t compute, OpTimer& timer);
    ~ResidualOffload();
    ResidualOffload(const ResidualOffload&) = delete;
    ResidualOffload& operator=(const ResidualOffload&) = delete;

    bool enabled() const { return host_ != nullptr; }
    // Before layer l's residual is written into its slot: the compute stream waits until the slot's
    // previous occupant is saved to host.
    void before_write(int l);
    // Layer l's residual was just written (queued on the compute stream): copy it to host.
    void written(int l);
    // Start copying layer l back into its slot unless the slot still holds it (l < 0: nothing).
    void load(int l);
    // The compute stream waits for layer l's copy into its slot.
    void get(int l);
    // The compute stream waits for every copy queued so far, and the events are settled
    // (cuda/pass_event.h): CUDA graphs, before a pass (outside a capture) and at its end (inside).
    void join();

private:
    void* host_ = nullptr;
    void* slots_[2] = {nullptr, nullptr};
    std::size_t bytes_ = 0;
    cudaStream_t compute_ = nullptr;
    OpTimer& timer_;
    cuda::Stream stream_;
    cuda::PassEvent written_[2], saved_[2], free_[2], loaded_[2];
    cuda::Event joined_;
    int slot_layer_[2] = {-1, -1};  // the layer whose input residual each slot holds
};

}  // namespace qtrain
