// What the GPU model tests set up alike, written once: the tiny ModelConfigs they run (one builder and
// the Qwen2 / Qwen3 / Llama 3 cases several files share), a random token batch, drawing norms and
// biases away from their init, handing the GPU's rounded weights to a CPU reference model, and the
// per-tensor gradient cosines between the two. Every value a test picks (shape, seed, masking,
// tolerance) stays at the call site; what is here is only what every copy did the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "gpu_test_util.h"
#include "model/cpu/cpu_model.h"
#include "model/cuda/cuda_model.h"
#include "model/model_config.h"

namespace qtrain::test {

// ---- configs ----

struct ModelShape {
    const char* name;
    int vocab, hidden, inter, layers, heads, kv_heads;
    bool tied;
};

// A small Qwen2-style config of `s`: head_dim = hidden / heads, RoPE base 1e4, eps 1e-6. Init range
// 0.05 (larger than 0.02) so that gradients are not dominated by the LM head. A test that needs
// another value sets it on the result and validates again.
inline ModelConfig small_config(const ModelShape& s) {
    ModelConfig c;
    c.vocab_size = s.vocab;
    c.hidden_size = s.hidden;
    c.intermediate_size = s.inter;
    c.num_hidden_layers = s.layers;
    c.num_attention_heads = s.heads;
    c.num_key_value_heads = s.kv_heads;
    c.head_dim = s.hidden / s.heads;
    c.tie_word_embeddings = s.tied;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-6;
    c.initializer_range = 0.05;
    c.validate("test");
    return c;
}

// Qwen2: q|k|v biases, head_dim 64, GQA 2, untied.
inline ModelConfig qwen2_case() { return small_config({"qwen2", 97, 128, 96, 2, 2, 1, false}); }

// Qwen3: q/k norm, head_dim 128 where hidden / heads is 64, no biases, tied.
inline ModelConfig qwen3_case() {
    ModelConfig c = small_config({"qwen3", 97, 256, 160, 2, 4, 2, true});
    c.architecture = "Qwen3ForCausalLM";
    c.model_type = "qwen3";
    c.head_dim = 128;
    c.qkv_bias = false;
    c.qk_norm = true;
    c.validate("test");
    return c;
}

// Llama 3: no biases, eps 1e-5, llama3 RoPE scaled within a few dozen positions, untied.
inline ModelConfig llama_case() {
    ModelConfig c = small_config({"llama", 131, 256, 192, 2, 4, 2, false});
    c.architecture = "LlamaForCausalLM";
    c.model_type = "llama";
    c.qkv_bias = false;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 500000.0;
    c.rope_type = "llama3";
    c.rope_factor = 4.0;
    c.rope_low_freq_factor = 1.0;
    c.rope_high_freq_factor = 4.0;
    c.rope_original_max_position_embeddings = 16;
    c.validate("test");
    return c;
}

// A named config, for the tests parameterised over families.
struct FamilyCase {
    const char* name;
    ModelConfig (*make)();
};

// ---- data ----

struct Tokens {
    std::vector<int32_t> in, tgt;
    Batch batch(int B, int T) const { return Batch{in.data(), tgt.data(), B, T}; }
};

// Whether random_tokens ignores some targets.
enum class Masked {
    None,           // every target trained on
    Every11thFrom3  // targets i with i % 11 == 3 are -1 (no random draw for them)
};

// B x T fresh random tokens below `vocab` from `seed`: inputs and targets drawn in turn per token.
inline Tokens random_tokens(int B, int T, int vocab, uint64_t seed, Masked masked) {
    Rng r(seed);
    Tokens d;
    for (int i = 0; i < B * T; ++i) {
        d.in.push_back(static_cast<int32_t>(r.below(vocab)));
        const bool skip = masked == Masked::Every11thFrom3 && i % 11 == 3;
        d.tgt.push_back(skip ? -1 : static_cast<int32_t>(r.below(vocab)));
    }
    return d;
}

// ---- weights ----

// A norm weight becomes 1 + 0.2 N(0, 1) and a bias 0.2 N(0, 1), drawn from `rng` in order (trained
// values are not their init's ones and zeros, which would hide a kernel that skips them); any other
// kind is left alone. Returns whether it drew.
inline bool draw_away_from_init(ParamKind kind, float* w, int64_t n, Rng& rng) {
    if (kind != ParamKind::Norm && kind != ParamKind::Bias) return false;
    for (int64_t i = 0; i < n; ++i) w[i] = (kind == ParamKind::Norm ? 1.0f : 0.0f) + 0.2f * rng.normal();
    return true;
}

// Every parameter of `cpu` set to the weights `gpu` computes with (bf16-rounded where the GPU model
// is bf16), so that the CPU reference sees the GPU's inputs.
inline void copy_gpu_weights(const CudaModel& gpu, CpuModel& cpu) {
    for (const auto& p : cpu.params()) {
        auto w = gpu.download(p.name, CudaModel::Which::Weights);
        std::copy(w.begin(), w.end(), cpu.param(p.name));
    }
}

// ---- gradients ----

// How a GPU model's gradients agree with a CPU model's: cosine per tensor (worst, median) and the LM
// head's own. k_proj.bias is left out: its exact gradient is zero (a bias shared by all keys shifts a
// query's scores equally), so both sides hold only rounding noise there.
struct GradAgreement {
    double worst = 1.0, median = 1.0, head = 1.0;
    std::string worst_name;
};
inline GradAgreement compare_gradients(const CudaModel& gpu, CpuModel& cpu) {
    GradAgreement r;
    std::vector<double> all;
    const std::string head = cpu.config().tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    for (const auto& p : cpu.params()) {
        if (p.name.find("k_proj.bias") != std::string::npos) continue;
        std::vector<float> ref(cpu.grad(p.name), cpu.grad(p.name) + p.numel());
        const double cs = cosine(gpu.download(p.name, CudaModel::Which::Grad), ref);
        all.push_back(cs);
        if (p.name == head) r.head = cs;
        if (cs < r.worst) r.worst = cs, r.worst_name = p.name;
    }
    std::sort(all.begin(), all.end());
    r.median = all[all.size() / 2];
    return r;
}

}  // namespace qtrain::test
