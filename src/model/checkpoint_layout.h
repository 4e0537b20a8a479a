// The flat layouts checkpoints are written in, as io/flat_layout.h describes them: the GPU model's
// (model/cuda/gpu_layout.h: its block checkpoints at --gpus=N > 1 hold ranges of it). gpu_layout.cpp is
// plain C++ and is built into qtrain_model too (CMakeLists.txt), so a build without CUDA — the CPU
// model, `train --export-checkpoint` — reads GPU checkpoints.
#pragma once

#include "io/flat_layout.h"
#include "model/cuda/gpu_layout.h"
#include "model/model_config.h"

namespace qtrain {

FlatLayout flat_layout_of(const GpuParamLayout& layout);
// flat_layout_of(make_gpu_layout(config))
FlatLayout gpu_checkpoint_layout(const ModelConfig& config);

}  // namespace qtrain
