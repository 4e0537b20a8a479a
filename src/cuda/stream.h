// Owning handles for CUDA streams and events: created by a factory, destroyed with their owner, movable,
// not copyable. A default-constructed handle holds nothing (for roles that create their streams only
// when a flag needs them). Both convert to the raw handle, so they pass straight to the runtime's calls.
// Destroying an event or stream that still has work queued is valid CUDA (the runtime releases it when
// the work is done); owners that must wait for their stream still synchronise it first.
#pragma once

#include <utility>

#include <cuda_runtime.h>

#include "cuda/check.h"

namespace qtrain::cuda {

class Stream {
public:
    Stream() = default;
    // A stream that does not synchronise with the legacy default stream (every stream of the model).
    static Stream non_blocking() {
        Stream s;
        CUDA_CHECK(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking));
        return s;
    }
    ~Stream() {
        if (s_) cudaStreamDestroy(s_);
    }
    Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    Stream& operator=(Stream&& o) noexcept {
        if (this != &o) {
            if (s_) cudaStreamDestroy(s_);
            s_ = std::exchange(o.s_, nullptr);
        }
        return *this;
    }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;

    cudaStream_t get() const { return s_; }
    operator cudaStream_t() const { return s_; }  // NOLINT: passes to the runtime as the raw handle

private:
    cudaStream_t s_ = nullptr;
};

class Event {
public:
    Event() = default;
    // An event for ordering streams only (no timing: cheaper to record and wait on).
    static Event ordering() {
        Event e;
        CUDA_CHECK(cudaEventCreateWithFlags(&e.e_, cudaEventDisableTiming));
        return e;
    }
    ~Event() {
        if (e_) cudaEventDestroy(e_);
    }
    Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
    Event& operator=(Event&& o) noexcept {
        if (this != &o) {
            if (e_) cudaEventDestroy(e_);
            e_ = std::exchange(o.e_, nullptr);
        }
        return *this;
    }
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;

    cudaEvent_t get() const { return e_; }
    operator cudaEvent_t() const { return e_; }  // NOLINT: passes to the runtime as the raw handle

private:
    cudaEvent_t e_ = nullptr;
};

}  // namespace qtrain::cuda
