// The bytes the GPU model's memory-bound ops must read and write in one micro-batch (and the optimizer
// in one step), by op-timer family ("rmsnorm fwd", "swiglu", "fp8 quantize", ...): the traffic floor
// of each, which bench/step_floor_bench turns into milliseconds at the device's measured copy rate (and
// the offloaded optimizer's at the PCIe rate). The counts are each kernel's unavoidable reads and writes
// of whole tensors as the model calls them (cuda_model_layer.cpp, cuda_model_linear.cpp): a kernel at
// its floor moves exactly these; one above it re-reads or moves more. Staged gradients' flushes are in
// ("gradient flush": the slot read, the kept copy read and written, over PCIe when offloaded). Not
// modelled: LoRA's adapters (bench/lora_overlap_bench), the recompute's repeated elementwise ops, small
// per-row state (rstd, lse, amax slots), host copies of streamed weights and residuals.
//
// CUDA-free (tests/gpu/step_traffic_test.cpp checks it on any machine).
#pragma once

#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/model_options.h"

namespace qtrain {

struct StepTraffic {
    std::string name;        // the op timer's family
    double device_bytes = 0;  // read + written in device memory
    double host_bytes = 0;    // over PCIe (the offloaded optimizer state)
    bool per_step = false;    // once per optimizer step (the optimizer), else once per micro-batch
};

// For a micro-batch of o.batch_size x o.seq_len tokens of config c under options o.
std::vector<StepTraffic> step_traffic(const ModelConfig& c, const ModelOptions& o);

}  // namespace qtrain
