// The list of a micro-batch's GEMMs (src/model/cuda/step_gemms.h) that bench/step_floor_bench times:
// its flop against the speed-of-light count the [T] line uses (train/sol.h), what LoRA, recompute,
// LM-head chunks and the FP8 flags change in it. CUDA-free: runs on any machine.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "model/cuda/step_gemms.h"
#include "model/lora.h"
#include "model/model_config.h"
#include "model/model_options.h"
#include "train/sol.h"

using namespace qtrain;

namespace {

ModelOptions micro_batch(int B, int T) {
    ModelOptions o;
    o.batch_size = B;
    o.seq_len = T;
    return o;
}

std::map<std::string, StepGemm> by_name(const std::vector<StepGemm>& list) {
    std::map<std::string, StepGemm> m;
    for (const StepGemm& g : list) EXPECT_TRUE(m.emplace(g.name, g).second) << g.name << " twice";
    return m;
}

// 6 x (every matmul parameter, the LM head included) per token: sol.h's count without its attention term
double sol_matmul_flop(const ModelConfig& c, int B, int T) {
    const double attention = 6.0 * c.num_hidden_layers * T * c.q_dim();
    return (training_flops_per_token(c, T) - attention) * B * T;
}

}  // namespace

TEST(StepGemms, FullModelIsSixFlopPerMatmulParameterAndToken) {
    for (const char* name : {"Qwen2.5-7B", "Qwen2.5-0.5B", "Qwen3-8B", "Llama-3.2-1B"}) {
        const ModelConfig c = preset_config(name);
        const std::vector<StepGemm> list = step_gemms(c, micro_batch(3, 512));
        EXPECT_EQ(list.size(), 15u) << name;  // 4 matrices x (fwd, dx, dw) + the head's three
        EXPECT_NEAR(total_flop(list) / sol_matmul_flop(c, 3, 512), 1.0, 1e-12) << name;
        for (const StepGemm& g : list) {
            EXPECT_EQ(g.tokens, 3 * 512) << g.name;
            EXPECT_EQ(g.calls, g.name.find("lm head") == std::string::npos ? c.num_hidden_layers : 1) << g.name;
            EXPECT_FALSE(g.fp8) << g.name;
            EXPECT_EQ(g.beta, g.pass == GemmPass::WeightGrad ? 1.0f : 0.0f) << g.name;
        }
    }
}

// Staged gradients (offloaded, bf16, ZeRO-2's per-layer reductions): each matrix's dW GEMM writes its slot
// part (beta 0, Gradients::matrices_written_whole); the LM head's still accumulates over its chunks.
TEST(StepGemms, StagedGradientsWriteTheLayerWeightGradients) {
    const ModelConfig c = preset_config("Qwen2.5-7B");
    for (int mode = 0; mode < 3; ++mode) {
        ModelOptions o = micro_batch(4, 1024);
        o.lmhead_chunks = 2;
        if (mode == 0) o.offload_gradients = true;
        if (mode == 1) o.param_grad_dtype = DType::BF16;
        if (mode == 2) o.gpus = 2, o.shard_gradients = true;
        for (const StepGemm& g : step_gemms(c, o)) {
            if (g.pass != GemmPass::WeightGrad) continue;
            EXPECT_EQ(g.beta, g.name == "dw lm head" ? 1.0f : 0.0f) << g.name << ", mode " << mode;
        }
    }
}

TEST(StepGemms, ShapesAreTheLayerMatricesAndTheHead) {
    const ModelConfig c = preset_config("Qwen2.5-7B");  // h 3584, 28 q heads and 4 kv heads of 128, I 18944
    const auto m = by_name(step_gemms(c, micro_batch(4, 1024)));
    EXPECT_EQ(m.at("fwd qkv").in, 3584);
    EXPECT_EQ(m.at("fwd qkv").out, 3584 + 2 * 512);
    EXPECT_TRUE(m.at("fwd qkv").bias);  // Qwen2's q|k|v bias
    EXPECT_FALSE(m.at("fwd o").bias);
    EXPECT_EQ(m.at("dx gate|up").out, 2 * 18944);
    EXPECT_EQ(m.at("dw down").in, 18944);
    EXPECT_EQ(m.at("fwd lm head").out, 152064);
    EXPECT_EQ(m.at("fwd lm head").in, 3584);
}

TEST(StepGemms, LoraHasNoWeightGradientAndItsBaseAccumulatesOntoTheAdapters) {
    ModelConfig c = preset_config("Qwen2.5-7B");
    ModelOptions o = micro_batch(12, 2048);
    o.lora.rank = 16;
    auto m = by_name(step_gemms(c, o));
    EXPECT_EQ(m.size(), 10u);  // fwd and dx of the four matrices and the frozen head
    for (const auto& [name, g] : m) EXPECT_NE(g.pass, GemmPass::WeightGrad) << name;
    EXPECT_NEAR(total_flop(step_gemms(c, o)) / sol_matmul_flop(c, 12, 2048), 4.0 / 6.0, 1e-12);
    // every target, no dropout: the adapters write y and dx first (lever 5), the base adds (beta 1);
    // not in the forward of a matrix with a bias (Qwen2's q|k|v), nor in the frozen head
    EXPECT_EQ(m.at("fwd qkv").beta, 0.0f);
    EXPECT_EQ(m.at("dx qkv").beta, 1.0f);
    for (const char* n : {"fwd o", "dx o", "fwd gate|up", "dx gate|up", "fwd down", "dx down"})
        EXPECT_EQ(m.at(n).beta, 1.0f) << n;
    EXPECT_EQ(m.at("fwd lm head").beta, 0.0f);
    EXPECT_EQ(m.at("dx lm head").beta, 0.0f);

    c = preset_config("Qwen3-8B");  // no q|k|v bias: its forward accumulates too
    EXPECT_EQ(by_name(step_gemms(c, o)).at("fwd qkv").beta, 1.0f);

    o.lora.targets = parse_lora_targets("q,v,gate,up,down", "--lora-targets");  // k and o without adapters
    m = by_name(step_gemms(c, o));
    EXPECT_EQ(m.at("fwd qkv").beta, 0.0f);
    EXPECT_EQ(m.at("dx qkv").beta, 0.0f);
    EXPECT_EQ(m.at("dx o").beta, 0.0f);
    EXPECT_EQ(m.at("dx gate|up").beta, 1.0f);

    o.lora.targets = parse_lora_targets("all", "--lora-targets");
    o.lora.dropout = 0.1f;  // dropout: the adapters add after the base
    for (const StepGemm& g : step_gemms(c, o)) EXPECT_EQ(g.beta, 0.0f) << g.name;

    o.lora.dropout = 0.0f;
    o.lora.train_also = kTrainEmbeddings;  // the head trained: its dW is back
    m = by_name(step_gemms(c, o));
    ASSERT_TRUE(m.count("dw lm head"));
    EXPECT_EQ(m.at("dw lm head").beta, 1.0f);
}

TEST(StepGemms, RecomputeAddsTheForwardsTheLayerProgramReruns) {
    const ModelConfig c = preset_config("Qwen2.5-1.5B");
    const int B = 2, T = 1024, L = c.num_hidden_layers;
    const double base = total_flop(step_gemms(c, micro_batch(B, T)));
    const double gate_up = 2.0 * B * T * c.hidden_size * 2.0 * c.intermediate_size * L;
    const double qkv = 2.0 * B * T * c.hidden_size * (c.q_dim() + 2.0 * c.kv_dim()) * L;
    const double o_proj = 2.0 * B * T * c.q_dim() * c.hidden_size * L;

    ModelOptions o = micro_batch(B, T);
    o.recompute_ffn = true;
    auto m = by_name(step_gemms(c, o));
    EXPECT_TRUE(m.count("recompute gate|up"));
    EXPECT_FALSE(m.count("recompute qkv"));
    EXPECT_NEAR(total_flop(step_gemms(c, o)), base + gate_up, base * 1e-12);

    o = micro_batch(B, T);
    o.recompute_swiglu = o.recompute_norm = true;  // elementwise only: no GEMM again
    EXPECT_NEAR(total_flop(step_gemms(c, o)), base, base * 1e-12);

    o = micro_batch(B, T);
    o.recompute_att = true;  // attention needs q|k|v again
    m = by_name(step_gemms(c, o));
    EXPECT_TRUE(m.count("recompute qkv"));
    EXPECT_NEAR(total_flop(step_gemms(c, o)), base + qkv, base * 1e-12);

    o = micro_batch(B, T);
    o.recompute_block = true;  // everything but the down projection (its output is added, never kept)
    m = by_name(step_gemms(c, o));
    EXPECT_FALSE(m.count("recompute down"));
    EXPECT_NEAR(total_flop(step_gemms(c, o)), base + gate_up + qkv + o_proj, base * 1e-12);
    EXPECT_EQ(m.at("recompute qkv").bias, true);
}

TEST(StepGemms, LmHeadChunksSplitTheTokensAsTheModelDoes) {
    const ModelConfig c = preset_config("Qwen2.5-0.5B");
    ModelOptions o = micro_batch(4, 1024);
    o.lmhead_chunks = 3;  // 4,096 rows: chunks of ceil(4096 / 3) = 1,366, the last one 1,364
    int64_t tokens = 0;
    int heads = 0;
    for (const StepGemm& g : step_gemms(c, o)) {
        if (g.name != "fwd lm head") continue;
        ++heads;
        tokens += g.tokens * g.calls;
        EXPECT_TRUE((g.tokens == 1366 && g.calls == 2) || (g.tokens == 1364 && g.calls == 1)) << g.tokens;
    }
    EXPECT_EQ(heads, 2);
    EXPECT_EQ(tokens, 4096);
    o.lmhead_chunks = 4;  // even: one entry of four calls
    EXPECT_EQ(by_name(step_gemms(c, o)).at("fwd lm head").calls, 4);
}

TEST(StepGemms, Fp8FlagsChooseOperandsAndAccumulationAsTheModel) {
    const ModelConfig c = preset_config("Qwen2.5-7B");
    ModelOptions o = micro_batch(16, 1024);
    o.matmul_dtype = DType::E4M3;  // e4m3 forward, bf16 backward
    auto m = by_name(step_gemms(c, o));
    EXPECT_TRUE(m.at("fwd down").fp8);
    EXPECT_FALSE(m.at("fwd down").fast_accum);
    EXPECT_FALSE(m.at("dx down").fp8);
    EXPECT_FALSE(m.at("dw down").fp8);
    EXPECT_FALSE(m.at("fwd lm head").fp8);

    o.gradient_dtype = DType::E5M2;
    o.fp8_fast_accum = Fp8FastAccum::Forward;
    m = by_name(step_gemms(c, o));
    EXPECT_TRUE(m.at("fwd qkv").fast_accum);
    EXPECT_TRUE(m.at("dx qkv").fp8);
    EXPECT_EQ(m.at("dx qkv").grad_dtype, DType::E5M2);
    EXPECT_FALSE(m.at("dx qkv").fast_accum);
    EXPECT_TRUE(m.at("dw qkv").fp8);

    o.fp8_fast_accum = Fp8FastAccum::All;
    o.fp8_lm_head = true;
    m = by_name(step_gemms(c, o));
    EXPECT_TRUE(m.at("dw gate|up").fast_accum);
    EXPECT_TRUE(m.at("fwd lm head").fp8);
    EXPECT_TRUE(m.at("fwd lm head").fast_accum);
    EXPECT_TRUE(m.at("dw lm head").fp8);
    EXPECT_FALSE(m.at("dw lm head").fast_accum);  // never in the head's backward (cuda_model_step.cpp)
    EXPECT_FALSE(m.at("dx lm head").fast_accum);
}

// LoRA's adapter GEMMs (lora_step_gemms: what bench/step_floor_bench times as "lora gemm"): every target's
// forward (u = x A^T, y += s u B^T) and backward (g = s dy B, dB, dA, dx += g A) are 6 r (in + out) flop a
// token whatever the stacking; stacked where LoraAdapters stacks them, with its slices' strides and alignment.
TEST(StepGemms, LoraAdaptersAreSixRankTimesInPlusOutFlopPerTargetAndToken) {
    const ModelConfig c = preset_config("Qwen2.5-7B");  // q|k|v bias: its adapters add after the base
    ModelOptions o = micro_batch(12, 2048);
    EXPECT_TRUE(lora_step_gemms(c, o).empty());  // no --lora-rank
    o.lora.rank = 16;
    const int64_t N = 12 * 2048, r = 16, L = c.num_hidden_layers;
    auto expected = [&](const char* targets) {
        double f = 0;
        for (int t = 0; t < kLoraTargets; ++t) {
            if (!((parse_lora_targets(targets, "--lora-targets") >> t) & 1u)) continue;
            const auto [out, in] = lora_target_shape(c, static_cast<LoraTarget>(t));
            f += 6.0 * r * (in + out) * N * L;
        }
        return f;
    };
    auto m = by_name(lora_step_gemms(c, o));
    EXPECT_EQ(m.size(), 12u + 6 + 9 + 6);  // q|k|v and gate|up stacked, o and down alone
    EXPECT_NEAR(total_flop(lora_step_gemms(c, o)), expected("all"), expected("all") * 1e-12);
    for (const auto& [name, g] : m) {
        EXPECT_TRUE(g.lora) << name;
        EXPECT_FALSE(g.fp8) << name;  // the adapters stay in the model dtype on the FP8 base
        EXPECT_EQ(g.calls, L) << name;
    }
    // stacked gate|up: one u [N, 2r]; up's y reads the u columns from r (32 bytes in) and writes y's from I
    EXPECT_EQ(m.at("lora fwd u gate|up").out, 2 * r);
    EXPECT_EQ(m.at("lora fwd y up").ld_in, 2 * r);
    EXPECT_EQ(m.at("lora fwd y up").ld_out, 2 * c.intermediate_size);
    EXPECT_EQ(m.at("lora fwd y up").min_alignment, 32);  // (B's row stride too: r bf16 = 32 bytes)
    EXPECT_EQ(m.at("lora fwd u gate|up").min_alignment, 64);  // u's row stride: 2r bf16
    EXPECT_EQ(m.at("lora dw B gate").min_alignment, 64);      // dB's fp32 rows of r, u and dy from column 0
    EXPECT_EQ(m.at("lora dw B up").min_alignment, 32);        // u's columns from r
    EXPECT_EQ(m.at("lora dw A gate|up").pass, GemmPass::WeightGrad);
    EXPECT_EQ(m.at("lora dw A gate|up").beta, 1.0f);
    // lever 5: every target, no dropout: the adapters write dx, and y where the base has no bias
    EXPECT_EQ(m.at("lora dx gate|up").beta, 0.0f);
    EXPECT_EQ(m.at("lora fwd y gate").beta, 0.0f);
    EXPECT_EQ(m.at("lora fwd y q").beta, 1.0f);  // Qwen2's q|k|v bias: the base first
    EXPECT_EQ(by_name(lora_step_gemms(preset_config("Qwen3-8B"), o)).at("lora fwd y q").beta, 0.0f);

    o.recompute_ffn = true;  // the recomputed gate|up forward runs its adapters again
    m = by_name(lora_step_gemms(c, o));
    EXPECT_TRUE(m.count("lora recompute u gate|up"));
    EXPECT_TRUE(m.count("lora recompute y up"));
    EXPECT_FALSE(m.count("lora recompute u qkv"));
    o.recompute_ffn = false;

    o.lora.dropout = 0.1f;  // per target (each mask differs), added after the base, dx through a scratch
    m = by_name(lora_step_gemms(c, o));
    EXPECT_FALSE(m.count("lora fwd u qkv"));
    EXPECT_EQ(m.at("lora fwd u k").out, r);
    EXPECT_EQ(m.at("lora fwd y k").ld_out, c.q_dim() + 2 * c.kv_dim());
    EXPECT_EQ(m.at("lora fwd y gate").beta, 1.0f);
    EXPECT_EQ(m.at("lora dx up").beta, 0.0f);
    EXPECT_NEAR(total_flop(lora_step_gemms(c, o)), expected("all"), expected("all") * 1e-12);

    o.lora.dropout = 0.0f;
    o.lora.targets = parse_lora_targets("v,down", "--lora-targets");
    m = by_name(lora_step_gemms(c, o));
    EXPECT_EQ(m.size(), 12u);
    EXPECT_EQ(m.at("lora fwd y v").beta, 1.0f);  // not all of q|k|v's output: the base writes it
    EXPECT_EQ(m.at("lora dx v").beta, 1.0f);
    EXPECT_EQ(m.at("lora dx down").beta, 0.0f);  // down's one target covers it
    EXPECT_NEAR(total_flop(lora_step_gemms(c, o)), expected("v,down"), expected("v,down") * 1e-12);
}
