// cuDNN SDPA behind attention.h (see attention_cudnn.h). The only file that includes the cuDNN
// frontend: its headers are large, so they stay out of every other translation unit.
#include "cuda/attention_cudnn.h"

#include "core/error.h"

namespace qtrain::detail {

std::size_t cudnn_attention_backward_workspace_estimate(const AttentionShape& s) {
    const auto up = [](std::size_t x, std::size_t m) { return (x + m - 1) / m * m; };
    const std::size_t b = s.B, h = s.Hq, t = s.T, d = s.D;
    std::size_t bytes = b * h * up(t, 64) * up(t, 64) * 2  // dP
                        + b * h * t * sizeof(float);       // softmax row sums
    if (s.Hq != s.Hkv) bytes += 2 * b * h * t * d * 2;     // dK, dV at full head count
    return bytes + (std::size_t{1} << 20);
}

namespace {
// The ragged graphs' batch: one sequence slot per document, s.max_docs per row, each up to T long.
[[maybe_unused]] AttentionShape ragged_batch(const AttentionShape& s) {
    QT_CHECK(s.max_docs > 0, "cuDNN attention: document masking needs AttentionShape::max_docs > 0");
    AttentionShape r = s;
    r.B = s.B * s.max_docs;
    return r;
}
}  // namespace

}  // namespace qtrain::detail

#if defined(QTRAIN_HAVE_CUDNN_FRONTEND)

#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cuda/cudnn_graph_util.h"

namespace qtrain::detail {
namespace {

using namespace cudnn;  // fe, check_fe, handles, Layout, input, build, workspace_of (cudnn_graph_util.h)

// Tensor ids of the variant packs. The ragged graphs add a ragged-offset tensor per data tensor
// (several of them point at the same device array) and the sequence lengths.
enum Uid : int64_t {
    kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV,
    kQOff, kKOff, kVOff, kOOff, kStatsOff, kdOOff, kdQOff, kdKOff, kdVOff, kSeqQ, kSeqKV
};

// q, k and v: strided views of the packed qkv rows (pointers offset in the variant pack).
std::array<std::shared_ptr<fe::graph::Tensor_attributes>, 3> qkv_inputs(fe::graph::Graph& g, const Layout& L) {
    return {input(g, "q", kQ, {L.B, L.Hq, L.T, L.D}, L.qkv_stride()),
            input(g, "k", kK, {L.B, L.Hkv, L.T, L.D}, L.qkv_stride()),
            input(g, "v", kV, {L.B, L.Hkv, L.T, L.D}, L.qkv_stride())};
}

std::unique_ptr<fe::graph::Graph> new_graph() { return cudnn::new_graph(fe::DataType_t::BFLOAT16); }

std::unique_ptr<fe::graph::Graph> build_forward(const AttentionShape& s, cudnnHandle_t h) {
    const Layout L(s);
    auto g = new_graph();
    auto [q, k, v] = qkv_inputs(*g, L);
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("attention_forward")
                    .set_generate_stats(true)
                    .set_causal_mask(true)
                    .set_attn_scale(1.0f / std::sqrt(static_cast<float>(s.D)));
    auto [o, stats] = g->sdpa(q, k, v, opts);
    o->set_output(true).set_uid(kO).set_dim({L.B, L.Hq, L.T, L.D}).set_stride(L.out_stride());
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({L.B, L.Hq, L.T, 1})
        .set_stride({L.Hq * L.T, L.T, 1, 1});
    build(*g, h, "building the forward graph");
    return g;
}

std::unique_ptr<fe::graph::Graph> build_backward(const AttentionShape& s, cudnnHandle_t h) {
    const Layout L(s);
    auto g = new_graph();
    auto [q, k, v] = qkv_inputs(*g, L);
    auto o = input(*g, "o", kO, {L.B, L.Hq, L.T, L.D}, L.out_stride());
    auto dout = input(*g, "dO", kdO, {L.B, L.Hq, L.T, L.D}, L.out_stride());
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim({L.B, L.Hq, L.T, 1})
                               .set_stride({L.Hq * L.T, L.T, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("attention_backward")
                    .set_causal_mask(true)
                    .set_attn_scale(1.0f / std::sqrt(static_cast<float>(s.D)))
                    .set_deterministic_algorithm(true);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
    dq->set_output(true).set_uid(kdQ).set_dim({L.B, L.Hq, L.T, L.D}).set_stride(L.qkv_stride());
    dk->set_output(true).set_uid(kdK).set_dim({L.B, L.Hkv, L.T, L.D}).set_stride(L.qkv_stride());
    dv->set_output(true).set_uid(kdV).set_dim({L.B, L.Hkv, L.T, L.D}).set_stride(L.qkv_stride());
    build(*g, h, "building the backward graph");
    return g;
}

// ---- Ragged graphs (document masking): one sequence per document, attention_ragged.h ----
// Dims as the plain graphs with the batch of ragged_batch(s) (N = B*max_docs sequences of up to T
// tokens); each data tensor's batch stride is replaced by its ragged offsets, and a padding mask with
// seq_len_q = seq_len_kv (the document's length) bounds each sequence. Top-left causal within it.

std::shared_ptr<fe::graph::Tensor_attributes> ragged_offsets(fe::graph::Graph& g, const char* name, int64_t uid,
                                                            int64_t n) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({n + 1, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::INT64));
}

std::shared_ptr<fe::graph::Tensor_attributes> seq_lens(fe::graph::Graph& g, const char* name, int64_t uid, int64_t n) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::INT32));
}

std::shared_ptr<fe::graph::Tensor_attributes> ragged_input(fe::graph::Graph& g, const char* name, int64_t uid,
                                                          std::vector<int64_t> dim, std::vector<int64_t> stride,
                                                          int64_t off_uid) {
    auto off = ragged_offsets(g, (std::string(name) + "_offsets").c_str(), off_uid, dim[0]);
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim(dim)
                        .set_stride(stride)
                        .set_ragged_offset(off));
}

// lse as cuDNN's ragged stats: [tokens, Hq] token-major, offset token * Hq.
std::vector<int64_t> ragged_stats_dim(const Layout& L) { return {L.B, L.Hq, L.T, 1}; }
std::vector<int64_t> ragged_stats_stride(const Layout& L) { return {L.T * L.Hq, 1, L.Hq, 1}; }

std::array<std::shared_ptr<fe::graph::Tensor_attributes>, 3> ragged_qkv_inputs(fe::graph::Graph& g, const Layout& L) {
    return {ragged_input(g, "q", kQ, {L.B, L.Hq, L.T, L.D}, L.qkv_stride(), kQOff),
            ragged_input(g, "k", kK, {L.B, L.Hkv, L.T, L.D}, L.qkv_stride(), kKOff),
            ragged_input(g, "v", kV, {L.B, L.Hkv, L.T, L.D}, L.qkv_stride(), kVOff)};
}

// The ragged graphs before building. sm_version > 0 sets the target architecture before the nodes
// are made, so the frontend can validate them on a machine without a GPU (a debugging aid).
std::unique_ptr<fe::graph::Graph> make_ragged_forward(const AttentionShape& s, int sm_version = 0) {
    const Layout L(ragged_batch(s));
    auto g = new_graph();
    if (sm_version > 0) g->set_sm_version(sm_version);
    auto [q, k, v] = ragged_qkv_inputs(*g, L);
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("attention_forward_ragged")
                    .set_generate_stats(true)
                    .set_causal_mask(true)
                    .set_padding_mask(true)
                    .set_seq_len_q(seq_lens(*g, "seq_len_q", kSeqQ, L.B))
                    .set_seq_len_kv(seq_lens(*g, "seq_len_kv", kSeqKV, L.B))
                    .set_attn_scale(1.0f / std::sqrt(static_cast<float>(s.D)));
    auto [o, stats] = g->sdpa(q, k, v, opts);
    o->set_output(true)
        .set_uid(kO)
        .set_dim({L.B, L.Hq, L.T, L.D})
        .set_stride(L.out_stride())
        .set_ragged_offset(ragged_offsets(*g, "o_offsets", kOOff, L.B));
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(ragged_stats_dim(L))
        .set_stride(ragged_stats_stride(L))
        .set_ragged_offset(ragged_offsets(*g, "stats_offsets", kStatsOff, L.B));
    return g;
}

std::unique_ptr<fe::graph::Graph> make_ragged_backward(const AttentionShape& s, int sm_version = 0) {
    const Layout L(ragged_batch(s));
    auto g = new_graph();
    if (sm_version > 0) g->set_sm_version(sm_version);
    auto [q, k, v] = ragged_qkv_inputs(*g, L);
    auto o = ragged_input(*g, "o", kO, {L.B, L.Hq, L.T, L.D}, L.out_stride(), kOOff);
    auto dout = ragged_input(*g, "dO", kdO, {L.B, L.Hq, L.T, L.D}, L.out_stride(), kdOOff);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim(ragged_stats_dim(L))
                               .set_stride(ragged_stats_stride(L))
                               .set_data_type(fe::DataType_t::FLOAT)
                               .set_ragged_offset(ragged_offsets(*g, "stats_offsets", kStatsOff, L.B)));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("attention_backward_ragged")
                    .set_causal_mask(true)
                    .set_padding_mask(true)
                    .set_seq_len_q(seq_lens(*g, "seq_len_q", kSeqQ, L.B))
                    .set_seq_len_kv(seq_lens(*g, "seq_len_kv", kSeqKV, L.B))
                    .set_attn_scale(1.0f / std::sqrt(static_cast<float>(s.D)))
                    .set_deterministic_algorithm(true);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
    dq->set_output(true)
        .set_uid(kdQ)
        .set_dim({L.B, L.Hq, L.T, L.D})
        .set_stride(L.qkv_stride())
        .set_ragged_offset(ragged_offsets(*g, "dq_offsets", kdQOff, L.B));
    dk->set_output(true)
        .set_uid(kdK)
        .set_dim({L.B, L.Hkv, L.T, L.D})
        .set_stride(L.qkv_stride())
        .set_ragged_offset(ragged_offsets(*g, "dk_offsets", kdKOff, L.B));
    dv->set_output(true)
        .set_uid(kdV)
        .set_dim({L.B, L.Hkv, L.T, L.D})
        .set_stride(L.qkv_stride())
        .set_ragged_offset(ragged_offsets(*g, "dv_offsets", kdVOff, L.B));
    return g;
}

std::unique_ptr<fe::graph::Graph> build_ragged_forward(const AttentionShape& s, cudnnHandle_t h) {
    auto g = make_ragged_forward(s);
    build(*g, h, "building the ragged (document-masked) forward graph");
    return g;
}

std::unique_ptr<fe::graph::Graph> build_ragged_backward(const AttentionShape& s, cudnnHandle_t h) {
    auto g = make_ragged_backward(s);
    build(*g, h, "building the ragged (document-masked) backward graph");
    return g;
}

enum class Pass { Forward, Backward, RaggedForward, RaggedBackward };

// Built graphs, per pass, device and shape, per thread like the handles they are built with (a plan
// is executed with the handle it was built on; one thread per GPU in threads mode, so no lock).
// Entries live as long as the thread (a handful of shapes). max_docs is part of the shape of the
// ragged graphs only (the plain ones are built and found with it ignored).
const fe::graph::Graph& graph_for(Pass pass, const AttentionShape& s, cudnnHandle_t h) {
    using Key = std::tuple<int, int, int, int, int, int, int, int>;
    thread_local std::map<Key, std::unique_ptr<fe::graph::Graph>> cache;
    const bool ragged = pass == Pass::RaggedForward || pass == Pass::RaggedBackward;
    const Key key{static_cast<int>(pass), current_device(), s.B, s.T, s.Hq, s.Hkv, s.D, ragged ? s.max_docs : 0};
    auto& g = cache[key];
    if (!g) {
        switch (pass) {
            case Pass::Forward: g = build_forward(s, h); break;
            case Pass::Backward: g = build_backward(s, h); break;
            case Pass::RaggedForward: g = build_ragged_forward(s, h); break;
            case Pass::RaggedBackward: g = build_ragged_backward(s, h); break;
        }
    }
    return *g;
}

// q, k and v start at column 0, Hq*D and (Hq+Hkv)*D of each packed row.
template <class P>
P offset(P base, int64_t elements) {
    using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<P>>, const char, char>;
    return static_cast<P>(static_cast<Byte*>(base) + elements * 2);  // bf16
}

// The variant pack's q, k and v: views into the packed qkv rows.
std::unordered_map<int64_t, void*> qkv_pack(const void* qkv, const AttentionShape& s) {
    const int64_t qcols = static_cast<int64_t>(s.Hq) * s.D, kcols = static_cast<int64_t>(s.Hkv) * s.D;
    return {{kQ, const_cast<void*>(qkv)},
            {kK, const_cast<void*>(offset(qkv, qcols))},
            {kV, const_cast<void*>(offset(qkv, qcols + kcols))}};
}

// Runs the cached graph of `pass` for shape s on `stream` with the pointers of `pack`.
void execute(Pass pass, const AttentionShape& s, std::unordered_map<int64_t, void*>& pack, void* workspace,
             cudaStream_t stream) {
    const char* what = pass == Pass::Forward          ? "the forward"
                       : pass == Pass::Backward       ? "the backward"
                       : pass == Pass::RaggedForward  ? "the ragged (document-masked) forward"
                                                      : "the ragged (document-masked) backward";
    cudnnHandle_t h = handle_for_current_device();
    cudnn::execute(graph_for(pass, s, h), h, pack, workspace, stream, what);
}

}  // namespace

bool cudnn_attention_compiled() { return true; }

std::string cudnn_runtime_version() {
    const std::size_t v = cudnnGetVersion();  // major * 10000 + minor * 100 + patch since cuDNN 9
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

bool cudnn_attention_available(std::string* why) {
    try {
        if (!gpu_visible()) {
            if (why) *why = "no GPU is visible";
            return false;
        }
        cudaDeviceProp prop{};
        CUDA_CHECK(cudaGetDeviceProperties(&prop, current_device()));
        if (prop.major < 8) {
            if (why) *why = "cuDNN flash attention needs compute capability 8.0 or newer";
            return false;
        }
        handle_for_current_device();
        return true;
    } catch (const std::exception& e) {
        if (why) *why = e.what();
        return false;
    }
}

std::size_t cudnn_attention_forward_workspace_bytes(const AttentionShape& s) {
    if (!gpu_visible()) return 4096;
    cudnnHandle_t h = handle_for_current_device();
    return static_cast<std::size_t>(workspace_of(graph_for(Pass::Forward, s, h)));
}

void cudnn_attention_forward(void* out, float* lse, const void* qkv, void* workspace, const AttentionShape& s,
                             cudaStream_t stream) {
    auto pack = qkv_pack(qkv, s);
    pack.insert({{kO, out}, {kStats, lse}});
    execute(Pass::Forward, s, pack, workspace, stream);
}

std::size_t cudnn_attention_backward_workspace_bytes(const AttentionShape& s) {
    if (!gpu_visible()) return cudnn_attention_backward_workspace_estimate(s);
    cudnnHandle_t h = handle_for_current_device();
    return static_cast<std::size_t>(workspace_of(graph_for(Pass::Backward, s, h)));
}

void cudnn_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                              void* workspace, const AttentionShape& s, cudaStream_t stream) {
    const int64_t qcols = static_cast<int64_t>(s.Hq) * s.D, kcols = static_cast<int64_t>(s.Hkv) * s.D;
    auto pack = qkv_pack(qkv, s);
    pack.insert({{kO, const_cast<void*>(out)},
                 {kdO, const_cast<void*>(dout)},
                 {kStats, const_cast<float*>(lse)},
                 {kdQ, dqkv},
                 {kdK, offset(dqkv, qcols)},
                 {kdV, offset(dqkv, qcols + kcols)}});
    execute(Pass::Backward, s, pack, workspace, stream);
}

// The index arrays of a ragged call: every offset tensor of the graph points at the array of its
// layout (q, k, v, dq, dk, dv at qkv_off; o, dO at o_off), seq_len_q and seq_len_kv at seq_len.
void add_ragged_index(std::unordered_map<int64_t, void*>& pack, const cuda::RaggedIndex& idx, bool backward) {
    pack.insert({{kQOff, idx.qkv_off},
                 {kKOff, idx.qkv_off},
                 {kVOff, idx.qkv_off},
                 {kOOff, idx.o_off},
                 {kStatsOff, idx.lse_off},
                 {kSeqQ, idx.seq_len},
                 {kSeqKV, idx.seq_len}});
    if (backward)
        pack.insert({{kdOOff, idx.o_off}, {kdQOff, idx.qkv_off}, {kdKOff, idx.qkv_off}, {kdVOff, idx.qkv_off}});
}

void cudnn_ragged_attention_forward(void* out, float* lse, const void* qkv, const cuda::RaggedIndex& idx,
                                    void* workspace, const AttentionShape& s, cudaStream_t stream) {
    auto pack = qkv_pack(qkv, s);
    pack.insert({{kO, out}, {kStats, lse}});
    add_ragged_index(pack, idx, false);
    execute(Pass::RaggedForward, s, pack, workspace, stream);
}

void cudnn_ragged_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                                     const cuda::RaggedIndex& idx, void* workspace, const AttentionShape& s,
                                     cudaStream_t stream) {
    const int64_t qcols = static_cast<int64_t>(s.Hq) * s.D, kcols = static_cast<int64_t>(s.Hkv) * s.D;
    auto pack = qkv_pack(qkv, s);
    pack.insert({{kO, const_cast<void*>(out)},
                 {kdO, const_cast<void*>(dout)},
                 {kStats, const_cast<float*>(lse)},
                 {kdQ, dqkv},
                 {kdK, offset(dqkv, qcols)},
                 {kdV, offset(dqkv, qcols + kcols)}});
    add_ragged_index(pack, idx, true);
    execute(Pass::RaggedBackward, s, pack, workspace, stream);
}

std::size_t cudnn_ragged_attention_forward_workspace_bytes(const AttentionShape& s) {
    if (!gpu_visible()) return 4096;
    cudnnHandle_t h = handle_for_current_device();
    return static_cast<std::size_t>(workspace_of(graph_for(Pass::RaggedForward, s, h)));
}

std::size_t cudnn_ragged_attention_backward_workspace_bytes(const AttentionShape& s) {
    if (!gpu_visible()) return cudnn_attention_backward_workspace_estimate(ragged_batch(s));
    cudnnHandle_t h = handle_for_current_device();
    return static_cast<std::size_t>(workspace_of(graph_for(Pass::RaggedBackward, s, h)));
}

}  // namespace qtrain::detail

#else  // no cuDNN frontend in this build

namespace qtrain::detail {

bool cudnn_attention_compiled() { return false; }

std::string cudnn_runtime_version() { return ""; }

bool cudnn_attention_available(std::string* why) {
    if (why) *why = "this build has no cuDNN attention backend (scripts/fetch_cudnn_frontend.sh, then rebuild)";
    return false;
}

void cudnn_attention_forward(void*, float*, const void*, void*, const AttentionShape&, cudaStream_t) {
    QT_CHECK(false, "cuDNN attention: not in this build");
}

std::size_t cudnn_attention_forward_workspace_bytes(const AttentionShape&) {
    QT_CHECK(false, "cuDNN attention: not in this build");
    return 0;
}

std::size_t cudnn_attention_backward_workspace_bytes(const AttentionShape&) {
    QT_CHECK(false, "cuDNN attention: not in this build");
    return 0;
}

void cudnn_attention_backward(void*, const void*, const void*, const void*, const float*, void*,
                              const AttentionShape&, cudaStream_t) {
    QT_CHECK(false, "cuDNN attention: not in this build");
}

void cudnn_ragged_attention_forward(void*, float*, const void*, const cuda::RaggedIndex&, void*, const AttentionShape&,
                                    cudaStream_t) {
    QT_CHECK(false, "cuDNN attention: not in this build");
}

void cudnn_ragged_attention_backward(void*, const void*, const void*, const void*, const float*,
                                     const cuda::RaggedIndex&, void*, const AttentionShape&, cudaStream_t) {
    QT_CHECK(false, "cuDNN attention: not in this build");
}

std::size_t cudnn_ragged_attention_forward_workspace_bytes(const AttentionShape&) {
    QT_CHECK(false, "cuDNN attention: not in this build");
    return 0;
}

std::size_t cudnn_ragged_attention_backward_workspace_bytes(const AttentionShape&) {
    QT_CHECK(false, "cuDNN attention: not in this build");
    return 0;
}

}  // namespace qtrain::detail

#endif
