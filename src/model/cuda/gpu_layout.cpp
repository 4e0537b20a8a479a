#include "model/cuda/gpu_layout.h"

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
    std::vector<ParamSpec> canon = qwen2_parameters(cfg);
    std::unordered_map<std::string, const ParamSpec*> by_name;
    for (const auto& p : canon) by_name[p.name] = &p;

    GpuParamLayout L;
    int64_t cursor = 0;
    auto place = [&](const std::string& name, bool pad_before) -> int64_t {
        const ParamSpec& p = *by_name.at(name);
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
        o.qkv_b = place(pre + "self_attn.q_proj.bias", true);
        place(pre + "self_attn.k_proj.bias", false);
        place(pre + "self_attn.v_proj.bias", false);
        o.o_w = place(pre + "self_attn.o_proj.weight", true);
        o.ln2 = place(pre + "post_attention_layernorm.weight", true);
        o.gate_up_w = place(pre + "mlp.gate_proj.weight", true);
        place(pre + "mlp.up_proj.weight", false);  // adjacent: one fused [2I, h] matrix
        o.down_w = place(pre + "mlp.down_proj.weight", true);
        L.layers.push_back(o);
    }
    L.final_norm = place("model.norm.weight", true);
    if (!L.layers.empty()) {
        L.layer_span = (L.final_norm - L.layers[0].ln1) / cfg.num_hidden_layers;
        for (int l = 0; l < cfg.num_hidden_layers; ++l)
            QT_CHECK(L.layers[l].ln1 == L.layers[0].ln1 + l * L.layer_span, "GPU layout: internal error (layer ", l,
                     " does not start at its span)");
    }
    L.lm_head = cfg.tie_word_embeddings ? L.embed : place("lm_head.weight", true);
    L.total = align_up(cursor);
    QT_CHECK(L.specs.size() == canon.size(), "GPU layout: internal error (", L.specs.size(), " of ", canon.size(),
             " tensors placed)");
    return L;
}

}  // namespace qtrain
