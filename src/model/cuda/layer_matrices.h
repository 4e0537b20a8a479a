// The four weight matrices of a decoder layer as the GPU model computes them (q|k|v fused, gate|up
// fused): their order (the FP8 scale slots' order), flat offsets and shapes W[rows = out, cols = in].
// Shared by the model's block math and the weights role, which quantises them.
#pragma once

#include <cstdint>

#include "model/cuda/gpu_layout.h"
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

}  // namespace qtrain
