// Advice for a memory plan that does not fit: which flags would make it fit, the largest batch that
// does, and how much host memory a run here may use. Each answer comes from real plans of the backend
// (plan_model), so a suggestion always fits when followed.
#pragma once

#include <cstdint>
#include <string>

#include "model/model_config.h"
#include "model/model_options.h"

namespace qtrain {

struct TrainOptions;

// The suggestions name their flags through the option table (option_table.h) and are planned with the
// model options those flags give (TrainOptions::model_options, so with what each implies).

// The first of a ladder of memory-saving flag sets (each saving more than the one before, at more
// recomputation) with which the plan of `o` fits `limit`; empty when none does or the backend refuses them.
std::string flags_that_fit(const ModelConfig& cfg, const TrainOptions& o, const std::string& device, uint64_t limit);
// The largest --batch-size (at most `cap`) whose plan fits `limit` (and `host_limit` when set), or 0.
int largest_batch_that_fits(const ModelConfig& cfg, ModelOptions m, const std::string& device, uint64_t limit,
                            uint64_t host_limit, int cap);
// The first of a ladder of host-memory-saving precision flags with which the pinned plan fits
// `host_limit` (and the device plan still fits `limit`); empty when none does.
std::string pinned_flags_that_fit(const ModelConfig& cfg, const TrainOptions& o, const std::string& device,
                                  uint64_t limit, uint64_t host_limit);
// What a training run may take of this machine's memory (pinned, or the CPU model's): the RAM — or the
// container's limit when lower — less 5% (at least 4 GiB); 0 when unknown.
uint64_t usable_host_memory();

}  // namespace qtrain
