// The memory plan against this machine before anything is allocated (docs/design.md, "Memory: plan,
// then allocate, then train"): a plan over the device limit (--memory-limit, or on the CPU this
// machine's RAM shared by the ranks) or over the pinned host memory fails here with the numbers and
// the flags or batch size that would fit; --plan-only prints the plan and how far the batch could grow.
#pragma once

#include <cstdint>
#include <string>

#include "model/memory_plan.h"
#include "model/model_config.h"
#include "model/model_options.h"

namespace qtrain {

struct TrainOptions;

struct CheckedPlan {
    MemoryPlan plan;
    uint64_t limit = 0;       // the device budget it was checked against (0 = none)
    uint64_t host_limit = 0;  // the pinned host budget (0 = none)
    bool explicit_host = false;
};

// Throws when the plan does not fit. `ranks` CPU ranks share this machine's RAM.
CheckedPlan check_memory_plan(const TrainOptions& o, const ModelConfig& cfg, const ModelOptions& mopt,
                              const std::string& device, int ranks);

// --plan-only: the plan, and notes on what else would fit under the limits.
void print_plan_only(const CheckedPlan& checked, const ModelConfig& cfg, const ModelOptions& mopt,
                     const std::string& device);

}  // namespace qtrain
