// cuDNN's FP8 SDPA behind attention_cudnn_fp8.h. Compiled with the cuDNN frontend's headers when CMake
// finds them (as attention_cudnn.cpp); otherwise every function throws.
#include "cuda/attention_cudnn_fp8.h"

#include "core/error.h"

#if defined(QTRAIN_HAVE_CUDNN_FRONTEND)

#include <cmath>
#include <map>
#include <string>
#include <memory>
#include <tuple>
#include <unordered_map>

#include "cuda/cudnn_graph_util.h"

namespace qtrain::detail {
namespace {

using namespace cudnn;  // fe, check_fe, handles, Layout, input, build, workspace_of, execute

// Tensor ids of the variant packs: the data, then one per scale and amax.
enum Uid : int64_t {
    kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV,
    kDescaleQ, kDescaleK, kDescaleV, kDescaleO, kDescaleDO, kDescaleS, kDescaleDP,
    kScaleS, kScaleO, kScaleDQ, kScaleDK, kScaleDV, kScaleDP,
    kAmaxS, kAmaxO, kAmaxDQ, kAmaxDK, kAmaxDV, kAmaxDP
};

fe::DataType_t fe_type(DType t) {
    QT_CHECK(t == DType::E4M3 || t == DType::E5M2, "cuDNN FP8 attention: gradients must be e4m3 or e5m2, got ",
             dtype_name(t));
    return t == DType::E4M3 ? fe::DataType_t::FP8_E4M3 : fe::DataType_t::FP8_E5M2;
}

std::unique_ptr<fe::graph::Graph> new_fp8_graph() { return new_graph(fe::DataType_t::FP8_E4M3); }

// One fp32 scalar in device memory (a scale, a descale or an amax).
std::shared_ptr<fe::graph::Tensor_attributes> scalar(fe::graph::Graph& g, const char* name, int64_t uid) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({1, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::FLOAT));
}

void scalar_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid) {
    t->set_output(true).set_uid(uid).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(
        fe::DataType_t::FLOAT);
}

float attn_scale(const AttentionShape& s) { return 1.0f / std::sqrt(static_cast<float>(s.D)); }

// The graphs before building; sm_version > 0 sets the target architecture first, so the frontend can
// validate them without a GPU (cudnn_fp8_attention_validate).
std::unique_ptr<fe::graph::Graph> make_forward(const AttentionShape& s, int sm_version = 0) {
    const Layout L(s);
    auto g = new_fp8_graph();
    if (sm_version > 0) g->set_sm_version(sm_version);
    auto q = input(*g, "q", kQ, {L.B, L.Hq, L.T, L.D}, L.qkv_stride());
    auto k = input(*g, "k", kK, {L.B, L.Hkv, L.T, L.D}, L.qkv_stride());
    auto v = input(*g, "v", kV, {L.B, L.Hkv, L.T, L.D}, L.qkv_stride());
    auto opts = fe::graph::SDPA_fp8_attributes()
                    .set_name("fp8_attention_forward")
                    .set_generate_stats(true)
                    .set_causal_mask(true)
                    .set_attn_scale(attn_scale(s));
    auto [o, stats, amax_s, amax_o] =
        g->sdpa_fp8(q, k, v, scalar(*g, "descale_q", kDescaleQ), scalar(*g, "descale_k", kDescaleK),
                    scalar(*g, "descale_v", kDescaleV), scalar(*g, "descale_s", kDescaleS),
                    scalar(*g, "scale_s", kScaleS), scalar(*g, "scale_o", kScaleO), opts);
    o->set_output(true).set_uid(kO).set_dim({L.B, L.Hq, L.T, L.D}).set_stride(L.out_stride());
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(L.stats_dim())
        .set_stride(L.stats_stride());
    scalar_output(amax_s, kAmaxS);
    scalar_output(amax_o, kAmaxO);
    return g;
}

std::unique_ptr<fe::graph::Graph> make_backward(const AttentionShape& s, DType grad_type, int sm_version = 0) {
    const Layout L(s);
    const fe::DataType_t gt = fe_type(grad_type);
    auto g = new_fp8_graph();
    if (sm_version > 0) g->set_sm_version(sm_version);
    auto q = input(*g, "q", kQ, {L.B, L.Hq, L.T, L.D}, L.qkv_stride());
    auto k = input(*g, "k", kK, {L.B, L.Hkv, L.T, L.D}, L.qkv_stride());
    auto v = input(*g, "v", kV, {L.B, L.Hkv, L.T, L.D}, L.qkv_stride());
    auto o = input(*g, "o", kO, {L.B, L.Hq, L.T, L.D}, L.out_stride());
    auto dout = input(*g, "dO", kdO, {L.B, L.Hq, L.T, L.D}, L.out_stride());
    dout->set_data_type(gt);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim(L.stats_dim())
                               .set_stride(L.stats_stride())
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_fp8_backward_attributes()
                    .set_name("fp8_attention_backward")
                    .set_causal_mask(true)
                    .set_attn_scale(attn_scale(s));
    auto [dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp] = g->sdpa_fp8_backward(
        q, k, v, o, dout, stats, scalar(*g, "descale_q", kDescaleQ), scalar(*g, "descale_k", kDescaleK),
        scalar(*g, "descale_v", kDescaleV), scalar(*g, "descale_o", kDescaleO), scalar(*g, "descale_dO", kDescaleDO),
        scalar(*g, "descale_s", kDescaleS), scalar(*g, "descale_dP", kDescaleDP), scalar(*g, "scale_s", kScaleS),
        scalar(*g, "scale_dQ", kScaleDQ), scalar(*g, "scale_dK", kScaleDK), scalar(*g, "scale_dV", kScaleDV),
        scalar(*g, "scale_dP", kScaleDP), opts);
    dq->set_output(true).set_uid(kdQ).set_data_type(gt).set_dim({L.B, L.Hq, L.T, L.D}).set_stride(L.qkv_stride());
    dk->set_output(true).set_uid(kdK).set_data_type(gt).set_dim({L.B, L.Hkv, L.T, L.D}).set_stride(L.qkv_stride());
    dv->set_output(true).set_uid(kdV).set_data_type(gt).set_dim({L.B, L.Hkv, L.T, L.D}).set_stride(L.qkv_stride());
    scalar_output(amax_dq, kAmaxDQ);
    scalar_output(amax_dk, kAmaxDK);
    scalar_output(amax_dv, kAmaxDV);
    scalar_output(amax_dp, kAmaxDP);
    return g;
}

std::unique_ptr<fe::graph::Graph> build_forward(const AttentionShape& s, cudnnHandle_t h) {
    auto g = make_forward(s);
    build(*g, h, "building the FP8 forward graph");
    return g;
}

std::unique_ptr<fe::graph::Graph> build_backward(const AttentionShape& s, DType grad_type, cudnnHandle_t h) {
    auto g = make_backward(s, grad_type);
    build(*g, h, "building the FP8 backward graph");
    return g;
}

// Built graphs per pass (0 forward; 1 backward e4m3, 2 backward e5m2), device and shape, per thread as
// attention_cudnn.cpp's.
const fe::graph::Graph& graph_for(int pass, const AttentionShape& s, cudnnHandle_t h) {
    using Key = std::tuple<int, int, int, int, int, int, int>;
    thread_local std::map<Key, std::unique_ptr<fe::graph::Graph>> cache;
    const Key key{pass, current_device(), s.B, s.T, s.Hq, s.Hkv, s.D};
    auto& g = cache[key];
    if (!g) g = pass == 0 ? build_forward(s, h) : build_backward(s, pass == 1 ? DType::E4M3 : DType::E5M2, h);
    return *g;
}

int backward_pass(DType grad_type) {
    fe_type(grad_type);  // (checks it)
    return grad_type == DType::E4M3 ? 1 : 2;
}

// 1-byte codes: q, k and v start at column 0, Hq*D and (Hq+Hkv)*D of each packed row.
void* at(const void* base, int64_t bytes) { return const_cast<char*>(static_cast<const char*>(base) + bytes); }

void* mut(const float* p) { return const_cast<float*>(p); }

void require(const void* p, const char* name) {
    QT_CHECK(p != nullptr, "cuDNN FP8 attention: the scale '", name, "' is missing");
}

}  // namespace

std::string cudnn_fp8_attention_validate(const AttentionShape& s, DType grad_type, int sm_version) {
    fe::error_t f = make_forward(s, sm_version)->validate();  // (get_message is not const)
    if (!f.is_good()) return "forward: " + f.get_message();
    fe::error_t b = make_backward(s, grad_type, sm_version)->validate();
    if (!b.is_good()) return "backward: " + b.get_message();
    return "";
}

std::size_t cudnn_fp8_attention_forward_workspace_bytes(const AttentionShape& s) {
    QT_CHECK(gpu_visible(), "cuDNN FP8 attention: no GPU is visible");
    cudnnHandle_t h = handle_for_current_device();
    return static_cast<std::size_t>(workspace_of(graph_for(0, s, h)));
}

std::size_t cudnn_fp8_attention_backward_workspace_bytes(const AttentionShape& s, DType grad_type) {
    QT_CHECK(gpu_visible(), "cuDNN FP8 attention: no GPU is visible");
    cudnnHandle_t h = handle_for_current_device();
    return static_cast<std::size_t>(workspace_of(graph_for(backward_pass(grad_type), s, h)));
}

void cudnn_fp8_attention_forward(void* out, float* lse, const void* qkv, const CudnnFp8ForwardScales& x,
                                 void* workspace, const AttentionShape& s, cudaStream_t stream) {
    for (auto [p, name] : {std::pair<const void*, const char*>{x.descale_q, "descale_q"},
                           {x.descale_k, "descale_k"}, {x.descale_v, "descale_v"}, {x.descale_s, "descale_s"},
                           {x.scale_s, "scale_s"}, {x.scale_o, "scale_o"}, {x.amax_s, "amax_s"},
                           {x.amax_o, "amax_o"}})
        require(p, name);
    const int64_t qcols = static_cast<int64_t>(s.Hq) * s.D, kcols = static_cast<int64_t>(s.Hkv) * s.D;
    std::unordered_map<int64_t, void*> pack{
        {kQ, at(qkv, 0)}, {kK, at(qkv, qcols)}, {kV, at(qkv, qcols + kcols)}, {kO, out}, {kStats, lse},
        {kDescaleQ, mut(x.descale_q)}, {kDescaleK, mut(x.descale_k)}, {kDescaleV, mut(x.descale_v)},
        {kDescaleS, mut(x.descale_s)}, {kScaleS, mut(x.scale_s)}, {kScaleO, mut(x.scale_o)},
        {kAmaxS, x.amax_s}, {kAmaxO, x.amax_o}};
    cudnnHandle_t h = handle_for_current_device();
    execute(graph_for(0, s, h), h, pack, workspace, stream, "the FP8 forward");
}

void cudnn_fp8_attention_backward(void* dqkv, const void* dout, DType grad_type, const void* qkv, const void* out,
                                  const float* lse, const CudnnFp8BackwardScales& x, void* workspace,
                                  const AttentionShape& s, cudaStream_t stream) {
    for (auto [p, name] : {std::pair<const void*, const char*>{x.descale_q, "descale_q"},
                           {x.descale_k, "descale_k"}, {x.descale_v, "descale_v"}, {x.descale_o, "descale_o"},
                           {x.descale_do, "descale_do"}, {x.descale_s, "descale_s"}, {x.descale_dp, "descale_dp"},
                           {x.scale_s, "scale_s"}, {x.scale_dq, "scale_dq"}, {x.scale_dk, "scale_dk"},
                           {x.scale_dv, "scale_dv"}, {x.scale_dp, "scale_dp"}, {x.amax_dq, "amax_dq"},
                           {x.amax_dk, "amax_dk"}, {x.amax_dv, "amax_dv"}, {x.amax_dp, "amax_dp"}})
        require(p, name);
    const int64_t qcols = static_cast<int64_t>(s.Hq) * s.D, kcols = static_cast<int64_t>(s.Hkv) * s.D;
    std::unordered_map<int64_t, void*> pack{
        {kQ, at(qkv, 0)}, {kK, at(qkv, qcols)}, {kV, at(qkv, qcols + kcols)},
        {kO, const_cast<void*>(out)}, {kdO, const_cast<void*>(dout)}, {kStats, mut(lse)},
        {kdQ, at(dqkv, 0)}, {kdK, at(dqkv, qcols)}, {kdV, at(dqkv, qcols + kcols)},
        {kDescaleQ, mut(x.descale_q)}, {kDescaleK, mut(x.descale_k)}, {kDescaleV, mut(x.descale_v)},
        {kDescaleO, mut(x.descale_o)}, {kDescaleDO, mut(x.descale_do)}, {kDescaleS, mut(x.descale_s)},
        {kDescaleDP, mut(x.descale_dp)}, {kScaleS, mut(x.scale_s)}, {kScaleDQ, mut(x.scale_dq)},
        {kScaleDK, mut(x.scale_dk)}, {kScaleDV, mut(x.scale_dv)}, {kScaleDP, mut(x.scale_dp)},
        {kAmaxDQ, x.amax_dq}, {kAmaxDK, x.amax_dk}, {kAmaxDV, x.amax_dv}, {kAmaxDP, x.amax_dp}};
    cudnnHandle_t h = handle_for_current_device();
    execute(graph_for(backward_pass(grad_type), s, h), h, pack, workspace, stream, "the FP8 backward");
}

}  // namespace qtrain::detail

#else  // no cuDNN frontend in this build

namespace qtrain::detail {

namespace {
[[noreturn]] void not_built() {
    throw_error("cuDNN FP8 attention: this build has no cuDNN attention backend (scripts/fetch_cudnn_frontend.sh, "
                "then rebuild)");
}
}  // namespace

std::string cudnn_fp8_attention_validate(const AttentionShape&, DType, int) {
    return "this build has no cuDNN attention backend";
}
std::size_t cudnn_fp8_attention_forward_workspace_bytes(const AttentionShape&) { not_built(); }
std::size_t cudnn_fp8_attention_backward_workspace_bytes(const AttentionShape&, DType) { not_built(); }
void cudnn_fp8_attention_forward(void*, float*, const void*, const CudnnFp8ForwardScales&, void*,
                                 const AttentionShape&, cudaStream_t) {
    not_built();
}
void cudnn_fp8_attention_backward(void*, const void*, DType, const void*, const void*, const float*,
                                  const CudnnFp8BackwardScales&, void*, const AttentionShape&, cudaStream_t) {
    not_built();
}

}  // namespace qtrain::detail

#endif
