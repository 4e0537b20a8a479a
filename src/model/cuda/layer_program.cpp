#include "model/cuda/layer_program.h"

#include "core/error.h"

namespace qtrain {

LayerProgram make_layer_program(const GpuParamLayout& layout) {
    LayerProgram p;
    p.has_qkv_bias = !layout.layers.empty() && layout.layers[0].has_qkv_bias();
    p.has_qk_norm = !layout.layers.empty() && layout.layers[0].has_qk_norm();
    for (const GpuLayerOffsets& o : layout.layers)
        QT_CHECK(o.has_qkv_bias() == p.has_qkv_bias && o.has_qk_norm() == p.has_qk_norm,
                 "GPU model: internal error (layers differ in their q|k|v bias or q/k norm)");
    using A = Act;
    using R = RecomputeSet;
    // {op, name, reads, writes, redo, renorm, residual, bias}
    p.steps = {
        {LayerOp::InputNorm, "input norm", 0, acts({A::ResIn, A::Ln1}), nullptr, &R::ln1, A::ResIn},
        {LayerOp::QkvLinear, "qkv linear", acts({A::Ln1}), acts({A::Qkv}), &R::qkv, nullptr, A::Count,
         p.has_qkv_bias},
        {LayerOp::Rope, p.has_qk_norm ? "q/k norm + rope" : "rope", acts({A::Qkv}), acts({A::Qkv}), &R::qkv, nullptr,
         A::Count, false, p.has_qk_norm},
        {LayerOp::Attention, "attention", acts({A::Qkv}), acts({A::Att, A::Lse}), &R::att},
        {LayerOp::OutLinear, "o linear", acts({A::Att}), acts({A::TmpH}), &R::res_mid},
        {LayerOp::PostAttnNorm, "post-attention norm", acts({A::ResIn, A::TmpH}), acts({A::ResMid, A::Ln2}),
         &R::res_mid, &R::ln2, A::ResMid},
        {LayerOp::GateUpLinear, "gate|up linear", acts({A::Ln2}), acts({A::GateUp}), &R::gate_up},
        {LayerOp::Swiglu, "swiglu", acts({A::GateUp}), acts({A::Swi}), &R::swi},
        {LayerOp::DownLinear, "down linear", acts({A::Swi}), acts({A::TmpH})},
    };
    return p;
}

StepRun recompute_run(const LayerStep& s, const RecomputeSet& rc) {
    if (s.redo && rc.*s.redo) return StepRun::Recompute;
    if (s.renorm && rc.*s.renorm) return StepRun::Renorm;
    return StepRun::Skip;
}

ActSet dropped_acts(const RecomputeSet& rc) {
    ActSet d = acts({Act::TmpH});
    auto drop = [&](bool flag, std::initializer_list<Act> list) {
        if (flag) d |= acts(list);
    };
    drop(rc.ln1, {Act::Ln1});
    drop(rc.qkv, {Act::Qkv});
    drop(rc.att, {Act::Att, Act::Lse});
    drop(rc.res_mid, {Act::ResMid});
    drop(rc.ln2, {Act::Ln2});
    drop(rc.gate_up, {Act::GateUp});
    drop(rc.swi, {Act::Swi});
    return d;
}

void check_recompute(const LayerProgram& program, const RecomputeSet& rc) {
    ActSet missing = dropped_acts(rc);
    for (const LayerStep& s : program.steps) {
        const StepRun how = recompute_run(s, rc);
        if (how == StepRun::Skip) continue;
        const ActSet reads = how == StepRun::Renorm ? acts({s.residual}) : s.reads;
        QT_CHECK((reads & missing) == 0, "GPU model: internal error (the recompute's ", s.name,
                 " step reads an activation that is neither kept nor recomputed before it)");
        missing &= ~(how == StepRun::Renorm ? s.writes & ~acts({s.residual}) : s.writes);
    }
    // what the backward reads of the layer (every activation but the scratch) is there again
    QT_CHECK((missing & ~acts({Act::TmpH})) == 0,
             "GPU model: internal error (the recompute leaves a dropped activation unwritten)");
}

}  // namespace qtrain
