// What the LoRA GPU tests (cuda_lora_*_test.cpp) set up alike, written once: the adapter options, the
// model options of the bf16/fp32 base and of the FP8 base, the families they loop over, starting
// models alike (the same base, the same non-zero B), comparing adapter gradients with the CPU model's,
// and the "step both and compare bit for bit" runs. Every value a test picks (shape, seed, dropout,
// tolerance) stays at the call site; what is here is only what every copy did the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "gpu_model_fixture.h"
#include "model/cuda/cuda_model.h"
#include "model/lora.h"

namespace qtrain::test {

// ---- options ----

// The adapters every LoRA GPU test trains: rank 8, alpha 16, seed 4242 (A is drawn from it), on
// `targets` (--lora-targets syntax), with `dropout` and --train-also `also`.
inline LoraOptions lora_options(float dropout, const std::string& targets = "all", uint32_t also = 0) {
    LoraOptions l;
    l.rank = 8;
    l.alpha = 16.0f;
    l.dropout = dropout;
    l.targets = parse_lora_targets(targets, "--lora-targets");
    l.seed = 4242;
    l.train_also = also;
    return l;
}

// The GPU model on the bf16 (or fp32) base: model, matmul and gradient dtype `act`, two LM-head chunks.
inline ModelOptions lora_gpu_options(DType act, int B, int T, const LoraOptions& lora) {
    ModelOptions o = CpuModel::fp32_options(B, T);
    o.model_dtype = o.matmul_dtype = o.gradient_dtype = act;
    o.lmhead_chunks = 2;
    o.lora = lora;
    return o;
}

// The exact (fp32) CPU reference with the same adapters and LM-head chunks.
inline ModelOptions lora_cpu_options(int B, int T, const LoraOptions& lora) {
    ModelOptions o = CpuModel::fp32_options(B, T);
    o.lmhead_chunks = 2;
    o.lora = lora;
    return o;
}

// A bf16 model with `matmul` matmuls and `grad` gradients: with matmul e4m3 and LoRA on, the FP8 base
// (the files that need its layouts set fp8_lm_head, shard_weights or fp8_base_keep_transposed on it).
inline ModelOptions fp8_base_options(DType matmul, DType grad, int B, int T, const LoraOptions& lora) {
    ModelOptions o = CpuModel::fp32_options(B, T);
    o.model_dtype = DType::BF16;
    o.matmul_dtype = matmul;
    o.gradient_dtype = grad;
    o.lmhead_chunks = 2;
    o.lora = lora;
    return o;
}

// The three families the FP8-base layout tests loop over (gpu_model_fixture.h's cases).
inline const FamilyCase kLoraFamilies[] = {{"qwen2", qwen2_case}, {"qwen3", qwen3_case}, {"llama", llama_case}};

// ---- starting alike ----

// The same base on every model (init_random(init_seed)) and the same non-zero B (0.05 x normal draws of
// Rng(b_seed), read from the first model's adapters); A is the seed's on all. B = 0 would make every
// A gradient zero and a comparison of them say nothing.
inline void start_lora_models(std::initializer_list<CudaModel*> models, uint64_t init_seed, uint64_t b_seed) {
    for (CudaModel* m : models) m->init_random(init_seed);
    CudaModel& first = **models.begin();
    Rng rng(b_seed);
    for (const ParamSpec& s : first.lora()->host().specs()) {
        std::vector<float> v = first.download(s.name, CudaModel::Which::Master);
        if (s.name.find(".lora_B.") != std::string::npos)
            for (float& x : v) x = 0.05f * rng.normal();
        for (CudaModel* m : models) m->upload_master(s.name, v.data());
    }
}

// The GPU model and CPU references from one seed: the base's norms and biases drawn off their init
// (the first CPU's draws, uploaded to the GPU), the same non-zero B (A: the same seed's). `rounded`:
// every CPU takes the GPU's base as the GPU holds it (bf16-rounded), so it computes with what the GPU
// computes with.
inline void same_start(CudaModel& gpu, const std::vector<CpuModel*>& cpus, uint64_t seed, bool rounded) {
    gpu.init_random(seed);
    for (CpuModel* c : cpus) c->init_random(seed);
    Rng rng(seed + 1);
    CpuModel& first = *cpus.front();
    for (const auto& p : first.params()) {
        float* w = first.param(p.name);
        if (draw_away_from_init(p.kind, w, p.numel(), rng)) gpu.upload_master(p.name, w);
    }
    if (rounded)
        for (CpuModel* c : cpus) copy_gpu_weights(gpu, *c);
    for (const ParamSpec& s : first.lora().specs()) {
        std::vector<float> v(first.lora().param(s.name), first.lora().param(s.name) + s.numel());
        if (s.name.find(".lora_B.") != std::string::npos)
            for (float& x : v) x = 0.05f * rng.normal();
        gpu.upload_master(s.name, v.data());
        for (CpuModel* c : cpus) std::copy(v.begin(), v.end(), c->lora().param(s.name));
    }
}

// ---- comparing ----

// Every trained tensor's gradient (adapters and --train-also tensors) of the GPU against the CPU's:
// the worst relative error (and its name) and the worst cosine, over all and over the --train-also
// tensors alone (their PEFT names have no ".lora_").
struct LoraAgreement {
    double worst_rel = 0, worst_cos = 1, trained_rel = 0, trained_cos = 1;
    std::string worst;
};
inline LoraAgreement compare_lora_grads(const CudaModel& gpu, CpuModel& cpu) {
    LoraAgreement a;
    for (const ParamSpec& s : cpu.lora().specs()) {
        std::vector<float> ref(cpu.grad(s.name), cpu.grad(s.name) + s.numel());
        const auto g = gpu.download(s.name, CudaModel::Which::Grad);
        const double rel = rel_max_error(g, ref), cos = cosine(g, ref);
        if (rel > a.worst_rel) a.worst_rel = rel, a.worst = s.name;
        a.worst_cos = std::min(a.worst_cos, cos);
        if (s.name.find(".lora_") == std::string::npos)
            a.trained_rel = std::max(a.trained_rel, rel), a.trained_cos = std::min(a.trained_cos, cos);
    }
    return a;
}

// The rest of a GPU-vs-CPU step (cuda_lora_test.cpp's bounds, which cuda_lora_train_also_test.cpp
// shares) after both made the same pass and `a` compared their gradients: gradients within 1e-4
// relative (fp32) or cosine 0.995 (bf16); an AdamW step on both (epsilon 1e-2, as in cuda_model_test:
// the update a smooth function of the gradient) with loss and norm close; then fp32 checks every
// master against the CPU's, and bf16 follows the CPU's values so the next step compares gradients,
// not drift.
inline void expect_lora_step_matches_cpu(CudaModel& gpu, CpuModel& cpu, const LoraAgreement& a, int step, bool fp32) {
    if (fp32) EXPECT_LT(a.worst_rel, 1e-4) << a.worst;
    else EXPECT_GE(a.worst_cos, 0.995) << a.worst;
    const OptimizerParams op{1e-3f, 0.9f, 0.95f, 1e-2f, 0.1f, 1.0f, step};
    const StepStats sc = cpu.optimizer_step(op), sg = gpu.optimizer_step(op);
    EXPECT_NEAR(sg.loss, sc.loss, (fp32 ? 1e-5 : 2e-2) * sc.loss);
    EXPECT_NEAR(sg.grad_norm, sc.grad_norm, (fp32 ? 1e-4 : 5e-2) * sc.grad_norm);
    if (!fp32) {
        for (const ParamSpec& s : cpu.lora().specs()) gpu.upload_master(s.name, cpu.lora().param(s.name));
        return;
    }
    for (const ParamSpec& s : cpu.lora().specs()) {
        std::vector<float> ref(cpu.lora().param(s.name), cpu.lora().param(s.name) + s.numel());
        EXPECT_LT(rel_max_error(gpu.download(s.name, CudaModel::Which::Master), ref), 1e-5) << s.name;
    }
}

// Three passes (tokens of seed 10 + step, scale 0.5) on both, each followed by the comparison of
// expect_lora_step_matches_cpu (gradients, then an AdamW step on both); `label` names the printed lines.
inline void expect_lora_steps_match_cpu(CudaModel& gpu, CpuModel& cpu, const ModelConfig& cfg, int B, int T,
                                        bool fp32, const std::string& label) {
    for (int step = 1; step <= 3; ++step) {
        SCOPED_TRACE(step);
        const Tokens d = random_tokens(B, T, cfg.vocab_size, 10 + step, Masked::Every11thFrom3);
        cpu.forward_backward(d.batch(B, T), 0.5f);
        gpu.forward_backward(d.batch(B, T), 0.5f);
        const LoraAgreement a = compare_lora_grads(gpu, cpu);
        std::printf("[%s step %d] adapter grads: worst rel %.3g (%s), worst cosine %.6f\n", label.c_str(), step,
                    a.worst_rel, a.worst.c_str(), a.worst_cos);
        expect_lora_step_matches_cpu(gpu, cpu, a, step, fp32);
    }
}

// The frozen base did not move (layer 0's q_proj is the CPU's, rounded to bf16 unless fp32) and has no
// gradient.
inline void expect_frozen_base_unmoved(const CudaModel& gpu, CpuModel& cpu, const ModelConfig& cfg, bool fp32) {
    const std::string q = "model.layers.0.self_attn.q_proj.weight";
    std::vector<float> q0(cpu.param(q), cpu.param(q) + cfg.q_dim() * cfg.hidden_size);
    EXPECT_EQ(gpu.download(q, CudaModel::Which::Weights), fp32 ? q0 : round_bf16(q0));
    EXPECT_ERROR(gpu.download(q, CudaModel::Which::Grad), "frozen under LoRA");
}

// One training pass (tokens of `seed`, scale 0.5) on both; every trained tensor's gradient equal bit
// for bit, and not all of them zero (else the comparison would say nothing).
inline void expect_same_pass_gradients(CudaModel& a, CudaModel& b, const ModelConfig& cfg, int B, int T,
                                       uint64_t seed) {
    const Tokens d = random_tokens(B, T, cfg.vocab_size, seed, Masked::Every11thFrom3);
    a.forward_backward(d.batch(B, T), 0.5f);
    b.forward_backward(d.batch(B, T), 0.5f);
    int nonzero = 0;
    for (const ParamSpec& s : a.lora()->host().specs()) {
        const std::vector<float> ga = a.download(s.name, CudaModel::Which::Grad);
        EXPECT_EQ(ga, b.download(s.name, CudaModel::Which::Grad)) << s.name;
        for (float x : ga) nonzero += x != 0.0f;
    }
    EXPECT_GT(nonzero, 0) << "every gradient is zero: the comparison would say nothing";
}

// Two models started alike: three AdamW steps of two micro-batches each (tokens 100 x step + micro,
// scale 0.5) with equal losses and norms, then every trained tensor's master and moments, and an
// evaluation, equal bit for bit. Returns the first model's step stats (for checks of the caller's).
inline std::vector<StepStats> expect_lora_steps_equal(CudaModel& a, CudaModel& b, const ModelConfig& cfg, int B,
                                                      int T) {
    std::vector<StepStats> stats;
    for (int step = 1; step <= 3; ++step) {
        for (int micro = 0; micro < 2; ++micro) {  // (gradient accumulation over two micro-batches)
            const Tokens d = random_tokens(B, T, cfg.vocab_size, 100 * step + micro, Masked::Every11thFrom3);
            a.forward_backward(d.batch(B, T), 0.5f);
            b.forward_backward(d.batch(B, T), 0.5f);
        }
        const OptimizerParams op{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step};
        const StepStats sa = a.optimizer_step(op), sb = b.optimizer_step(op);
        EXPECT_EQ(sa.loss, sb.loss) << "step " << step;
        EXPECT_EQ(sa.grad_norm, sb.grad_norm) << "step " << step;
        stats.push_back(sa);
    }
    for (const ParamSpec& s : a.lora()->host().specs())
        for (auto w : {CudaModel::Which::Master, CudaModel::Which::AdamM, CudaModel::Which::AdamV})
            EXPECT_EQ(a.download(s.name, w), b.download(s.name, w)) << s.name;
    const Tokens e = random_tokens(B, T, cfg.vocab_size, 999, Masked::Every11thFrom3);
    EXPECT_EQ(a.evaluate(e.batch(B, T)), b.evaluate(e.batch(B, T)));
    return stats;
}

// Two GPU LoRA models built from different options (recompute, CUDA graphs, the FP8 base's layouts,
// --train-also, ...) must agree bit for bit: the same init (seed 9), the same non-zero B (Rng 3), then
// expect_lora_steps_equal.
inline void expect_lora_steps_bit_identical(const ModelOptions& a_opts, const ModelOptions& b_opts,
                                            const ModelConfig& cfg) {
    CudaModel a(cfg, a_opts), b(cfg, b_opts);
    start_lora_models({&a, &b}, 9, 3);
    expect_lora_steps_equal(a, b, cfg, a_opts.batch_size, a_opts.seq_len);
}

// ---- checkpoints and exports ----

// Steps first..last of a resume test (tokens 50 + step, scale 1, lr 2e-3); their losses.
inline std::vector<float> lora_resume_steps(CudaModel& m, const ModelConfig& cfg, int B, int T, int first, int last) {
    std::vector<float> losses;
    for (int step = first; step <= last; ++step) {
        const Tokens d = random_tokens(B, T, cfg.vocab_size, 50 + step, Masked::Every11thFrom3);
        m.forward_backward(d.batch(B, T), 1.0f);
        losses.push_back(m.optimizer_step({2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step}).loss);
    }
    return losses;
}

// --merge-lora of the FP8 base merges into the bf16 base, not the e4m3 copies: `fp8` trains two steps
// (B 2, T 48, tokens 70 + step, lr 1e-2), `bf16` (the same base, the bf16 base's options) takes its
// adapters; the merged exports are the same non-empty bytes.
inline void expect_fp8_merge_is_bf16_merge(CudaModel& fp8, CudaModel& bf16, const ModelConfig& cfg) {
    for (int step = 1; step <= 2; ++step) {
        const Tokens d = random_tokens(2, 48, cfg.vocab_size, 70 + step, Masked::Every11thFrom3);
        fp8.forward_backward(d.batch(2, 48), 1.0f);
        fp8.optimizer_step({1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step});
    }
    for (const ParamSpec& s : fp8.lora()->host().specs())
        bf16.upload_master(s.name, fp8.download(s.name, CudaModel::Which::Master).data());
    TempDir dir;
    fp8.save_hf(dir.file("fp8"));
    bf16.save_hf(dir.file("bf16"));
    const std::string a = read_file(dir.file("fp8/model.safetensors"));
    EXPECT_FALSE(a.empty());
    EXPECT_EQ(a, read_file(dir.file("bf16/model.safetensors")));
}

}  // namespace qtrain::test
