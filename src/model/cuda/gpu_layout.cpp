#include "model/cuda/gpu_layout.h"

#include <algorithm>

#include "core/error.h"

namespace qtrain {

namespace {
constexpr int64_t kAlign = 64;
int64_t align_up(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
}  // namespace

int64_t GpuParamLayout::resident_index(int64_t off, bool with_embedding) const {
    const int64_t begin = layer_begin(0);
    QT_CHECK(off >= begin || with_embedding,
             "weight/gradient streaming: internal error (the embedding is not in this resident buffer)");
    return off < begin ? off : (with_embedding ? begin : 0) + (off - layers_end());
}

int64_t GpuParamLayout::compact_index(int64_t off) const {
    const int64_t head = layer_begin(0);
    const int l = layer_of(off);
    if (l < 0) return off < head ? off : head + static_cast<int64_t>(layers.size()) * small_span + (off - layers_end());
    const int64_t rel = off - layer_begin(l) + head;  // in layer 0's coordinates, as small_runs0
    int64_t before = 0;
    for (const Range& r : small_runs0) {
        if (rel >= r.begin && rel < r.end) return head + l * small_span + before + (rel - r.begin);
        before += r.end - r.begin;
    }
    throw_error(cat("GPU layout: internal error (element ", off, " of layer ", l,
                    " is in a matrix, which the FP8 base keeps in e4m3 only)"));
}

int64_t GpuParamLayout::compact_total() const {
    return total - static_cast<int64_t>(layers.size()) * (layer_span - small_span);
}

std::vector<GpuParamLayout::Range> GpuParamLayout::layer_runs(int l, bool matrices) const {
    std::vector<Range> runs = matrices ? matrix_runs0 : small_runs0;
    const int64_t shift = layer_begin(l) - layer_begin(0);
    for (Range& r : runs) r = {r.begin + shift, r.end + shift};
    return runs;
}

std::vector<GpuParamLayout::Range> GpuParamLayout::layer_non_matrix_elements() const {
    std::vector<Range> out;
    if (layers.empty()) return out;
    const int64_t first = layer_begin(0);
    int64_t at = 0;  // specs are in flat order
    for (std::size_t i = 0; i < specs.size(); ++i) {
        if (specs[i].layer != 0 || specs[i].kind != ParamKind::Matrix) continue;
        const int64_t b = offsets[i] - first, e = b + specs[i].numel();
        if (b > at) out.push_back({at, b});
        at = std::max(at, e);
    }
    if (at < layer_span) out.push_back({at, layer_span});
    return out;
}

bool GpuParamLayout::in_matrix(int64_t off) const {
    const int l = layer_of(off);
    if (l < 0) return false;
    const int64_t rel = off - (layer_begin(l) - layer_begin(0));
    for (const Range& r : matrix_runs0)
        if (rel >= r.begin && rel < r.end) return true;
    return false;
}

int64_t GpuParamLayout::offset_of(const std::string& name) const {
    auto it = index.find(name);
    QT_CHECK(it != index.end(), "GPU model: no parameter named '", name, "'");
    return offsets[it->second];
}

const ParamSpec& GpuParamLayout::spec_of(const std::string& name) const {
    auto it = index.find(name);
    QT_CHECK(it != index.end(), "GPU model: no parameter named '", name, "'");
    return specs[it->second];
}

GpuParamLayout make_gpu_layout(const ModelConfig& cfg) {
    // canonical list, then reorder each layer's tensors into fused groups
    std::vector<ParamSpec> canon = model_parameters(cfg);
    std::unordered_map<std::string, const ParamSpec*> by_name;
    for (const auto& p : canon) by_name[p.name] = &p;

    GpuParamLayout L;
    int64_t cursor = 0;
    auto place = [&](const std::string& name, bool pad_before) -> int64_t {
        auto found = by_name.find(name);
        if (found == by_name.end()) return -1;  // an optional tensor this block does not have
        const ParamSpec& p = *found->second;
        if (pad_before) cursor = align_up(cursor);
        L.index[name] = static_cast<int>(L.specs.size());
        L.specs.push_back(p);
        L.offsets.push_back(cursor);
        int64_t at = cursor;
        cursor += p.numel();
        return at;
    };
    L.embed = place("model.embed_tokens.weight", true);
    for (int l = 0; l < cfg.num_hidden_layers; ++l) {
        const std::string pre = "model.layers." + std::to_string(l) + ".";
        GpuLayerOffsets o{};
        o.ln1 = place(pre + "input_layernorm.weight", true);
        o.qkv_w = place(pre + "self_attn.q_proj.weight", true);
        place(pre + "self_attn.k_proj.weight", false);  // adjacent: one fused [q+2kv, h] matrix
        place(pre + "self_attn.v_proj.weight", false);
        o.qkv_b = place(pre + "self_attn.q_proj.bias", true);  // one [q+2kv] bias, when the block has it
        place(pre + "self_attn.k_proj.bias", false);
        place(pre + "self_attn.v_proj.bias", false);
        o.o_w = place(pre + "self_attn.o_proj.weight", true);
        o.o_b = place(pre + "self_attn.o_proj.bias", true);
        o.q_norm = place(pre + "self_attn.q_norm.weight", true);
        o.k_norm = place(pre + "self_attn.k_norm.weight", true);
        o.ln2 = place(pre + "post_attention_layernorm.weight", true);
        o.gate_up_w = place(pre + "mlp.gate_proj.weight", true);
        place(pre + "mlp.up_proj.weight", false);  // adjacent: one fused [2I, h] matrix
        o.gate_up_b = place(pre + "mlp.gate_proj.bias", true);
        place(pre + "mlp.up_proj.bias", false);
        o.down_w = place(pre + "mlp.down_proj.weight", true);
        o.down_b = place(pre + "mlp.down_proj.bias", true);
        L.layers.push_back(o);
    }
    L.final_norm = place("model.norm.weight", true);
    if (!L.layers.empty()) {
        L.layer_span = (L.final_norm - L.layers[0].ln1) / cfg.num_hidden_layers;
        for (int l = 0; l < cfg.num_hidden_layers; ++l)
            QT_CHECK(L.layers[l].ln1 == L.layers[0].ln1 + l * L.layer_span, "GPU layout: internal error (layer ", l,
                     " does not start at its span)");
    }
    // layer 0's runs: each tensor reaches to the next one (its padding), a run merges neighbours of a kind
    for (size_t i = 0; i < L.specs.size(); ++i) {
        if (L.specs[i].layer != 0) continue;
        const bool matrix = L.specs[i].kind == ParamKind::Matrix;
        const int64_t begin = L.offsets[i], end = i + 1 < L.specs.size() ? L.offsets[i + 1] : L.final_norm;
        auto& runs = matrix ? L.matrix_runs0 : L.small_runs0;
        if (!runs.empty() && runs.back().end == begin) runs.back().end = end;
        else runs.push_back({begin, end});
    }
    for (const auto& r : L.small_runs0) L.small_span += r.end - r.begin;
    L.lm_head = cfg.tie_word_embeddings ? L.embed : place("lm_head.weight", true);
    L.total = align_up(cursor);
    QT_CHECK(L.specs.size() == canon.size(), "GPU layout: internal error (", L.specs.size(), " of ", canon.size(),
             " tensors placed)");
    return L;
}

}  // namespace qtrain
