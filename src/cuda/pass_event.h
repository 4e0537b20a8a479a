// An ordering event between a role's side stream and the compute stream that knows whether work it
// stands for may still be outstanding: a role's side-stream work (copies to host, gradient flushes)
// forks off the compute stream and joins back through such events. Under CUDA graphs the role joins
// its side stream into the compute stream before each pass (eagerly, outside any capture) and at its
// end (inside the capture, which must end joined), and settles its events there: a wait on a settled
// event is skipped, because the join already ordered that work. That is what makes the pass
// capturable: a capture may only wait on events its own capture recorded, and every event recorded
// before it began is settled. Without graphs nothing is ever settled, and every wait happens as it
// always did.
#pragma once

#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/stream.h"

namespace qtrain::cuda {

class PassEvent {
public:
    PassEvent() = default;
    static PassEvent ordering() {
        PassEvent p;
        p.e_ = Event::ordering();
        return p;
    }
    void record(cudaStream_t s) {
        CUDA_CHECK(cudaEventRecord(e_, s));
        outstanding_ = true;
    }
    // `s` waits for the work recorded last, unless a join since then ordered it already.
    void wait(cudaStream_t s) const {
        if (outstanding_) CUDA_CHECK(cudaStreamWaitEvent(s, e_, 0));
    }
    // A join ordered everything recorded so far before the compute stream's later work.
    void settle() { outstanding_ = false; }

private:
    Event e_;
    bool outstanding_ = false;
};

// `compute` waits for everything queued on `side` so far (`joiner` is the side stream's event for it).
inline void join_into(cudaStream_t compute, cudaStream_t side, const Event& joiner) {
    CUDA_CHECK(cudaEventRecord(joiner, side));
    CUDA_CHECK(cudaStreamWaitEvent(compute, joiner, 0));
}

}  // namespace qtrain::cuda
