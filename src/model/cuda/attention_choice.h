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
// cuDNN runs where the build has it compiled in. --document-masking: auto picks flash; --attention=cudnn
// runs cuDNN's variable-length attention (one ragged sequence per document, --max-docs-per-row slots
// per row; cuda/attention_ragged.h), or throws with cuDNN's reason.
AttentionBackend choose_attention_backend(const ModelConfig& c, const ModelOptions& o);

// "cudnn", "cudnn (variable-length: ...)" with --document-masking, "flash", or "flash (cuDNN: <why
// not>)" when auto fell back (with --document-masking: "flash (cuDNN: document masking runs on
// qtrain's flash kernels; ...)"): for the [System] line.
std::string describe_attention_backend(const ModelConfig& c, const ModelOptions& o);

// The attention shape of B rows of T tokens for `backend`: with --document-masking on cuDNN it
// carries --max-docs-per-row (AttentionShape::max_docs), which selects cuDNN's ragged graphs.
AttentionShape attention_shape(const ModelConfig& c, const ModelOptions& o, int B, int T, AttentionBackend backend);

}  // namespace qtrain
