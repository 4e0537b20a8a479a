// The layer program: the steps of one decoder layer of the GPU model, in forward order, described once
// (docs/design.md, "The layer program"). The forward runs every step for each layer; the backward's
// recompute runs the same steps filtered by the --recompute-* flags (RecomputeSet), so what it
// regenerates is the forward's own work, not a copy of it; the backward walks the steps in reverse,
// each step's gradient after the one of the step that followed it. A family with one more op in its
// block adds one step here, its forward in CudaModel::forward_step and its gradient in
// CudaModel::backward_step (cuda_model_layer.cpp); forward, recompute and backward follow.
//
// CUDA-free: a step names what it does and which of the layer's activations it reads and writes; the
// block math is the model's.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "model/cuda/gpu_buffers.h"
#include "model/cuda/gpu_layout.h"

namespace qtrain {

enum class LayerOp : uint8_t {
    InputNorm,     // res_in = the residual stream (+ the previous layer's output); ln1 = RMSNorm(res_in)
    QkvLinear,     // qkv = ln1 Wqkv^T (+ the q|k|v bias when the layout has one)
    Rope,          // q and k rotated in place (after their per-head RMSNorm when the block has one: Qwen3)
    Attention,     // att, lse = causal attention over qkv
    OutLinear,     // tmp_h = att Wo^T
    PostAttnNorm,  // res_mid = res_in + tmp_h; ln2 = RMSNorm(res_mid)
    GateUpLinear,  // gate|up = ln2 Wgu^T
    Swiglu,        // swi = silu(gate) * up
    DownLinear,    // tmp_h = swi Wd^T (added to the residual by the next layer's InputNorm, or the final norm)
};

// A layer's activations (GpuLayerActivations, and the scratch tmp_h the linear outputs pass through).
enum class Act : uint8_t { ResIn, Ln1, Qkv, Att, Lse, ResMid, Ln2, GateUp, Swi, TmpH, Count };
using ActSet = uint32_t;
constexpr ActSet acts(std::initializer_list<Act> list) {
    ActSet s = 0;
    for (Act a : list) s |= ActSet{1} << static_cast<int>(a);
    return s;
}
constexpr bool has(ActSet s, Act a) { return (s >> static_cast<int>(a)) & 1; }

struct LayerStep {
    LayerOp op;
    const char* name;
    ActSet reads = 0, writes = 0;  // as the forward runs it (InputNorm reads the previous layer's)
    // The recompute flag that makes the backward re-run this step as the forward does (null: never
    // re-run: its outputs are kept, or the backward does not read them).
    bool RecomputeSet::*redo = nullptr;
    // Norm steps: the flag that re-runs only the normalisation, from the kept residual (the residual
    // add's inputs are gone by then; the forward normalised that same stored residual, so the output
    // and rstd are the forward's bits), and that residual.
    bool RecomputeSet::*renorm = nullptr;
    Act residual = Act::Count;
    bool bias = false;  // QkvLinear: the layout has a q|k|v bias (added in the GEMM; its gradient in the backward)
    // Rope: the block normalises each head of q and k first (Qwen3's q_norm / k_norm), fused into the
    // same kernel (cuda::qk_norm_rope_forward), which also keeps the pre-norm q|k and their rstd for
    // its backward (GpuLayerActivations::qk_pre / qk_rstd, recomputed with qkv).
    bool qk_norm = false;
};

// How the recompute runs a step.
enum class StepRun : uint8_t {
    Skip,
    Forward,    // as the forward pass (in the forward)
    Recompute,  // as the forward does, inside the backward's recompute
    Renorm,     // only the normalisation of the kept residual (norm steps)
};

struct LayerProgram {
    std::vector<LayerStep> steps;  // forward order; the backward walks them in reverse
    bool has_qkv_bias = false;
    bool has_qk_norm = false;
};

// The program of the model's decoder layers (every layer runs the same one).
LayerProgram make_layer_program(const GpuParamLayout& layout);
// What the recompute of `rc` does with step s: Skip, Recompute or Renorm.
StepRun recompute_run(const LayerStep& s, const RecomputeSet& rc);
// The activations the recompute of `rc` does not keep per layer (they share one buffer, gpu_buffers.h)
// and must regenerate before the backward reads them; tmp_h is never kept.
ActSet dropped_acts(const RecomputeSet& rc);
// Throws (internal error) when a step the recompute of `rc` runs reads an activation that is neither
// kept nor written by an earlier step of the same recompute.
void check_recompute(const LayerProgram& program, const RecomputeSet& rc);

}  // namespace qtrain
