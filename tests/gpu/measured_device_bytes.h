// What a model really takes on the device, for the tests that hold the memory plan to the allocation
// (CudaLoraFp8Base, CudaFp8WeightTransposes: MeasuredDeviceMemoryFallsByThePlannedAmount).
#pragma once

#include <cstdint>

#include "gpu_model_fixture.h"

namespace qtrain::test {

// Device bytes a model takes once built and through one training step (cudaMemGetInfo before and after,
// the model still alive; it is destroyed after the measurement). Another process on the GPU at the same
// time makes this wrong: run these tests alone.
inline int64_t measured_device_bytes(const ModelConfig& cfg, const ModelOptions& o) {
    size_t free0 = 0, free1 = 0, total = 0;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
    CudaModel m(cfg, o);
    m.init_random(4);
    const Tokens d = random_tokens(o.batch_size, o.seq_len, cfg.vocab_size, 5, Masked::Every11thFrom3);
    m.forward_backward(d.batch(o.batch_size, o.seq_len), 1.0f);
    m.optimizer_step({1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1});
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
    return static_cast<int64_t>(free0) - static_cast<int64_t>(free1);
}

}  // namespace qtrain::test
