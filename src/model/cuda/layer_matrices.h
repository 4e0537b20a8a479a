// The four weight matrices of a decoder layer as the GPU model computes them (q|k|v fused, gate|up
// fused): their order (the FP8 scale slots' order), flat offsets and shapes W[rows = out, cols = in].
// Shared by the model's block math and the weights role, which quantises them.
#pragma once

#include <array>
#include <cstdint>

#include "model/cuda/gpu_layout.h"
#include "model/lora.h"
#include "model/model_config.h"

namespace qtrain {

enum Matrix { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3 };

struct MatrixShape {
    int64_t offset, rows, cols;
};

inline MatrixShape layer_matrix(const GpuParamLayout& layout, const ModelConfig& c, int l, Matrix m) {
    const GpuLayerOffsets& o = layout.layers[l];
    const int64_t h = c.hidden_size, qkvd = c.q_dim() + 2 * c.kv_dim(), I = c.intermediate_size;
    switch (m) {
        case kQkv: return {o.qkv_w, qkvd, h};
        case kO: return {o.o_w, h, c.q_dim()};
        case kGateUp: return {o.gate_up_w, 2 * I, h};
        default: return {o.down_w, h, I};
    }
}

// LoRA's targets on a fused matrix and the first column of each one's slice of its output (q|k|v,
// gate|up: the fused output's order). The one description the model's adapters (CudaModel::lora_fwd /
// lora_bwd) and the step's GEMM list (step_gemms.cpp) both read. (Fixed arrays, not vectors: the model
// asks for it at every linear step of every layer.)
struct MatrixLoraTargets {
    std::array<LoraTarget, 3> targets;
    std::array<int64_t, 3> cols;
    int n;
};

inline MatrixLoraTargets matrix_lora_targets(const ModelConfig& c, Matrix m) {
    using T = LoraTarget;
    switch (m) {
        case kQkv: return {{T::Q, T::K, T::V}, {0, c.q_dim(), c.q_dim() + c.kv_dim()}, 3};
        case kO: return {{T::O}, {0}, 1};
        case kGateUp: return {{T::Gate, T::Up}, {0, c.intermediate_size}, 2};
        default: return {{T::Down}, {0}, 1};
    }
}

}  // namespace qtrain
