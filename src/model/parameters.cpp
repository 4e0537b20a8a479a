#include "model/parameters.h"

#include <algorithm>

#include "core/rng.h"

namespace qtrain {

std::vector<ParamSpec> model_parameters(const ModelConfig& c) {
    const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), i = c.intermediate_size, v = c.vocab_size,
                  d = c.head_dim;
    std::vector<ParamSpec> p;
    p.push_back({"model.embed_tokens.weight", {v, h}, ParamKind::Embedding, -1});
    for (int l = 0; l < c.num_hidden_layers; ++l) {
        const std::string pre = "model.layers." + std::to_string(l) + ".";
        // a Linear's weight [out, in], then its bias [out] when the block has one
        auto linear = [&](const char* name, int64_t out, int64_t in, bool bias) {
            p.push_back({pre + name + ".weight", {out, in}, ParamKind::Matrix, l});
            if (bias) p.push_back({pre + name + ".bias", {out}, ParamKind::Bias, l});
        };
        p.push_back({pre + "input_layernorm.weight", {h}, ParamKind::Norm, l});
        linear("self_attn.q_proj", q, h, c.qkv_bias);
        linear("self_attn.k_proj", kv, h, c.qkv_bias);
        linear("self_attn.v_proj", kv, h, c.qkv_bias);
        linear("self_attn.o_proj", h, q, c.o_bias);
        if (c.qk_norm) {
            p.push_back({pre + "self_attn.q_norm.weight", {d}, ParamKind::Norm, l});
            p.push_back({pre + "self_attn.k_norm.weight", {d}, ParamKind::Norm, l});
        }
        p.push_back({pre + "post_attention_layernorm.weight", {h}, ParamKind::Norm, l});
        linear("mlp.gate_proj", i, h, c.mlp_bias);
        linear("mlp.up_proj", i, h, c.mlp_bias);
        linear("mlp.down_proj", h, i, c.mlp_bias);
    }
    p.push_back({"model.norm.weight", {h}, ParamKind::Norm, -1});
    if (!c.tie_word_embeddings) p.push_back({"lm_head.weight", {v, h}, ParamKind::Matrix, -1});
    return p;
}

void init_parameter(const ParamSpec& spec, const ModelConfig& cfg, uint64_t seed, float* out) {
    const int64_t n = spec.numel();
    switch (spec.kind) {
        case ParamKind::Norm:
            for (int64_t k = 0; k < n; ++k) out[k] = 1.0f;
            return;
        case ParamKind::Bias:
            for (int64_t k = 0; k < n; ++k) out[k] = 0.0f;
            return;
        case ParamKind::Embedding:
        case ParamKind::Matrix: {
            uint64_t s = seed ^ hash_string(spec.name);
            const uint64_t start = splitmix64(s);
            const float std = static_cast<float>(cfg.initializer_range);
            // Value k is the normal() drawn after 2k draws from `start`; splitmix64's state is a
            // counter, so each chunk jumps straight to its first value and the threads produce the
            // sequential result (a 7B model's 7.6G values take minutes on one core).
            constexpr int64_t kChunk = 1 << 16;
            const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
            for (int64_t c = 0; c < chunks; ++c) {
                const int64_t k0 = c * kChunk, k1 = std::min(n, k0 + kChunk);
                Rng rng(start + static_cast<uint64_t>(2 * k0) * 0x9e3779b97f4a7c15ull);
                for (int64_t k = k0; k < k1; ++k) out[k] = std * rng.normal();
            }
            return;
        }
    }
}

}  // namespace qtrain
