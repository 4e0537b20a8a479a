// The layer program (src/model/cuda/layer_program.h): the one description of a decoder layer that the
// GPU model's forward, recompute and backward follow. These need no GPU: they check the description
// itself, and that the recompute it selects is what the hand-written recompute did before it.
#include <gtest/gtest.h>

#include <set>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/cuda/gpu_buffers.h"
#include "model/cuda/gpu_layout.h"
#include "model/cuda/layer_program.h"
#include "model/model_config.h"
#include "model/model_options.h"

using namespace qtrain;

namespace {

LayerProgram qwen_program() { return make_layer_program(make_gpu_layout(preset_config("Qwen2.5-0.5B"))); }

std::vector<std::pair<LayerOp, StepRun>> recompute_of(const LayerProgram& p, const RecomputeSet& rc) {
    std::vector<std::pair<LayerOp, StepRun>> r;
    for (const LayerStep& s : p.steps)
        if (const StepRun how = recompute_run(s, rc); how != StepRun::Skip) r.emplace_back(s.op, how);
    return r;
}

// Every distinct recompute set the --recompute-* flags make (with their implications).
std::vector<RecomputeSet> every_recompute_set() {
    std::vector<RecomputeSet> sets;
    std::set<std::vector<bool>> seen;
    for (int mask = 0; mask < 64; ++mask) {
        ModelOptions o;
        o.recompute_swiglu = mask & 1, o.recompute_norm = mask & 2, o.recompute_qkv = mask & 4;
        o.recompute_ffn = mask & 8, o.recompute_att = mask & 16, o.recompute_block = mask & 32;
        const RecomputeSet rc = recompute_set(o);
        if (seen.insert({rc.ln1, rc.ln2, rc.qkv, rc.att, rc.res_mid, rc.gate_up, rc.swi}).second) sets.push_back(rc);
    }
    return sets;
}

}  // namespace

TEST(LayerProgram, Qwen2BlockInForwardOrderWithItsBias) {
    const LayerProgram p = qwen_program();
    const std::vector<LayerOp> expected{LayerOp::InputNorm, LayerOp::QkvLinear,    LayerOp::Rope,
                                        LayerOp::Attention, LayerOp::OutLinear,    LayerOp::PostAttnNorm,
                                        LayerOp::GateUpLinear, LayerOp::Swiglu,    LayerOp::DownLinear};
    std::vector<LayerOp> ops;
    for (const LayerStep& s : p.steps) ops.push_back(s.op);
    EXPECT_EQ(ops, expected);
    EXPECT_TRUE(p.has_qkv_bias);
    EXPECT_TRUE(p.steps[1].bias);
    // exactly one step writes the layer's input residual (the residual offload saves it after it)
    int writers = 0;
    for (const LayerStep& s : p.steps) writers += has(s.writes, Act::ResIn);
    EXPECT_EQ(writers, 1);
}

TEST(LayerProgram, ALayoutWithoutQkvBiasDropsItFromTheQkvStep) {
    GpuParamLayout layout = make_gpu_layout(preset_config("Llama-3.2-1B"));  // no biases
    EXPECT_FALSE(layout.layers[0].has_qkv_bias());
    const LayerProgram p = make_layer_program(layout);
    EXPECT_FALSE(p.has_qkv_bias);
    for (const LayerStep& s : p.steps) EXPECT_FALSE(s.bias) << s.name;
    // the q|k|v matrix runs straight into o_proj's: one run of matrices, then the norm, then gate|up|down
    const auto runs = layout.layer_runs(0, true);
    ASSERT_EQ(runs.size(), 2u);
    EXPECT_EQ(runs[0].begin, layout.layers[0].qkv_w);
    EXPECT_EQ(runs[0].end, layout.layers[0].ln2);
    EXPECT_EQ(runs[1].begin, layout.layers[0].gate_up_w);
    layout.layers[1].qkv_b = 0;  // layers that disagree are an internal error
    EXPECT_THROW(make_layer_program(layout), Error);
}

// The recompute the program selects for each set is the one the hand-written recompute_layer ran
// before the program existed, step for step (so the GPU recompute tests' bits are unchanged).
TEST(LayerProgram, RecomputeRunsTheForwardsStepsTheFlagsSelect) {
    const LayerProgram p = qwen_program();
    const std::vector<RecomputeSet> sets = every_recompute_set();
    EXPECT_EQ(sets.size(), 19u);  // none, 2 x 3 x 3 - 1 and block
    for (const RecomputeSet& rc : sets) {
        std::vector<std::pair<LayerOp, StepRun>> old;
        if (rc.ln1) old.emplace_back(LayerOp::InputNorm, StepRun::Renorm);
        if (rc.qkv) old.emplace_back(LayerOp::QkvLinear, StepRun::Recompute), old.emplace_back(LayerOp::Rope, StepRun::Recompute);
        if (rc.att) old.emplace_back(LayerOp::Attention, StepRun::Recompute);
        if (rc.res_mid) {
            old.emplace_back(LayerOp::OutLinear, StepRun::Recompute);
            old.emplace_back(LayerOp::PostAttnNorm, StepRun::Recompute);
        } else if (rc.ln2) {
            old.emplace_back(LayerOp::PostAttnNorm, StepRun::Renorm);
        }
        if (rc.gate_up) old.emplace_back(LayerOp::GateUpLinear, StepRun::Recompute);
        if (rc.swi) old.emplace_back(LayerOp::Swiglu, StepRun::Recompute);
        EXPECT_EQ(recompute_of(p, rc), old) << "ln1 " << rc.ln1 << " ln2 " << rc.ln2 << " qkv " << rc.qkv << " att "
                                            << rc.att << " res_mid " << rc.res_mid << " gate_up " << rc.gate_up
                                            << " swi " << rc.swi;
        EXPECT_NO_THROW(check_recompute(p, rc));
    }
}

// check_recompute catches a program whose recompute would read what it dropped and did not
// regenerate, or leave a dropped activation unwritten.
TEST(LayerProgram, CheckRecomputeCatchesAStepThatLostItsFlag) {
    RecomputeSet att;
    att.qkv = att.att = true;
    LayerProgram p = qwen_program();
    p.steps[1].redo = nullptr;  // the qkv linear no longer re-run: RoPE would read a stale qkv
    EXPECT_THROW(check_recompute(p, att), Error);
    LayerProgram q = qwen_program();
    q.steps[7].redo = nullptr;  // SwiGLU no longer re-run: its output is dropped and never written
    RecomputeSet swi;
    swi.swi = true;
    EXPECT_THROW(check_recompute(q, swi), Error);
}
