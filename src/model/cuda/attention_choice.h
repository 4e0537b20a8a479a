// Which attention kernels the GPU model runs (--attention), decided once from the options, the build
// and the machine, so the plan (the backward's workspace), the forward and the backward agree.
#pragma once

#include <string>

#include "cuda/attention.h"
#include "model/model_config.h"
#include "model/model_options.h"

namespace qtrain {

// Flash or Cudnn. --attention=cudnn where cuDNN cannot run (not in the build, no cuDNN library, a
// shape cuDNN refuses such as --seq-len=1), or with --model-dtype=fp32, throws with the reason; auto
// falls back to flash. Without a visible GPU (--plan-only on another machine) auto and cudnn assume
// cuDNN runs where the build has it compiled in. --document-masking: auto picks flash (the cuDNN backend
// has no document masking) and --attention=cudnn throws naming both flags.
AttentionBackend choose_attention_backend(const ModelConfig& c, const ModelOptions& o);

// "cudnn", "flash", or "flash (cuDNN: <why not>)" when auto fell back (with --document-masking:
// "flash (cuDNN: document masking runs on qtrain's flash kernels)"): for the [System] line.
std::string describe_attention_backend(const ModelConfig& c, const ModelOptions& o);

}  // namespace qtrain
