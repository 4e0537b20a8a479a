// LoRA --train-also on the CPU reference model (issue 33): the norms and the embeddings / LM head
// trained in full beside the adapters. Their gradients under LoRA are the full model's: to the bit
// with fresh adapters (B = 0 adds exact zeros), and those of the merged model with trained ones.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "cpu_test_util.h"
#include "model/cpu/cpu_model.h"

namespace qtrain {
namespace {

using test::Near;

ModelOptions train_also_options(uint32_t train_also) {
    ModelOptions opt = CpuModel::fp32_options(2, 5);
    opt.lmhead_chunks = 2;
    opt.lora.rank = 3;
    opt.lora.alpha = 5.0f;
    opt.lora.train_also = train_also;
    return opt;
}

// base weights away from init, the same in both models
void randomize_base(CpuModel& full, CpuModel& lora, uint64_t seed) {
    Rng rng(seed);
    for (const auto& s : full.params()) {
        float* p = full.param(s.name);
        for (int64_t i = 0; i < s.numel(); ++i) {
            const float z = rng.normal();
            p[i] = s.kind == ParamKind::Norm ? 1.0f + 0.2f * z : s.kind == ParamKind::Bias ? 0.2f * z : 0.3f * z;
        }
        std::memcpy(lora.param(s.name), p, sizeof(float) * s.numel());
    }
}

std::vector<std::string> expected_trained(const ModelConfig& cfg, uint32_t train_also) {
    std::vector<std::string> names;
    for (const ParamSpec& s : model_parameters(cfg)) {
        const bool norm = s.kind == ParamKind::Norm, embed = s.name == "model.embed_tokens.weight" || s.name == "lm_head.weight";
        if ((norm && (train_also & kTrainNorms)) || (embed && (train_also & kTrainEmbeddings))) names.push_back(s.name);
    }
    return names;
}

// Fresh adapters (B = 0): the forward and every input gradient are the full model's to the bit, so
// the trained tensors' gradients are too.
void check_bit_equal(const ModelConfig& cfg, uint32_t train_also) {
    ModelOptions fo = CpuModel::fp32_options(2, 5);
    fo.lmhead_chunks = 2;
    CpuModel full(cfg, fo);
    CpuModel lora(cfg, train_also_options(train_also));
    randomize_base(full, lora, 7);
    const std::vector<std::string> trained = expected_trained(cfg, train_also);
    ASSERT_EQ(lora.lora().specs().size(), 2u * kLoraTargets * cfg.num_hidden_layers + trained.size());
    const test::TokenBatch tb = test::random_batch(2, 5, cfg.vocab_size, 11, /*mask_every=*/3);
    full.forward_backward(tb.view(), 0.5f);
    lora.forward_backward(tb.view(), 0.5f);
    for (const std::string& name : trained) {
        const int64_t n = lora.lora().spec(kPeftPrefix + name).numel();
        const float* g = lora.grad(kPeftPrefix + name);
        double amax = 0;
        for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::abs(static_cast<double>(g[i])));
        EXPECT_GT(amax, 1e-4) << name << ": no gradient";
        EXPECT_EQ(0, std::memcmp(g, full.grad(name), sizeof(float) * n)) << name;
    }
}

TEST(CpuLoraTrainAlso, GradientsEqualTheFullModelsWithFreshAdapters) {
    const uint32_t both = kTrainNorms | kTrainEmbeddings;
    check_bit_equal(test::tiny_config(false), both);
    check_bit_equal(test::tiny_config(true), both);  // tied: one matrix, the embedding's and the head's gradient
    check_bit_equal(test::tiny_qwen3_config(false), kTrainNorms);  // + q/k norms
    check_bit_equal(test::tiny_llama_config(true), kTrainEmbeddings);
}

// Trained adapters (B != 0): the gradients are those of the full model with the merged weights
// W + s B A (equal in math; in another order of sums).
TEST(CpuLoraTrainAlso, GradientsEqualTheMergedFullModelsWithTrainedAdapters) {
    for (const ModelConfig& cfg : {test::tiny_qwen3_config(false), test::tiny_config(true)}) {
        ModelOptions fo = CpuModel::fp32_options(2, 5);
        fo.lmhead_chunks = 2;
        CpuModel merged(cfg, fo);
        CpuModel lora(cfg, train_also_options(kTrainNorms | kTrainEmbeddings));
        randomize_base(merged, lora, 3);
        Rng rng(5);
        for (size_t i = 0; i < 2u * kLoraTargets * cfg.num_hidden_layers; ++i) {
            const ParamSpec& s = lora.lora().specs()[i];
            float* p = lora.param(s.name);
            for (int64_t k = 0; k < s.numel(); ++k) p[k] = 0.3f * rng.normal();
        }
        for (const auto& s : merged.params()) lora.lora().merge_tensor(s, merged.param(s.name));
        const test::TokenBatch tb = test::random_batch(2, 5, cfg.vocab_size, 13);
        merged.forward_backward(tb.view(), 1.0f);
        lora.forward_backward(tb.view(), 1.0f);
        for (const std::string& name : expected_trained(cfg, kTrainNorms | kTrainEmbeddings)) {
            const int64_t n = lora.lora().spec(kPeftPrefix + name).numel();
            const float *g = lora.grad(kPeftPrefix + name), *ref = merged.grad(name);
            for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(Near(g[i], ref[i], 1e-4, 1e-6)) << name << "[" << i << "]";
        }
    }
}

// AdamW moves the trained tensors in the base itself (one copy: the forward reads them there), clipped
// with the adapters; everything else of the base stays bit for bit.
TEST(CpuLoraTrainAlso, AdamWTrainsTheBaseTensorsInPlaceAndTheRestStaysFrozen) {
    const ModelConfig cfg = test::tiny_qwen3_config(true);
    CpuModel dummy(cfg, CpuModel::fp32_options(2, 5));
    CpuModel model(cfg, train_also_options(kTrainNorms));
    randomize_base(dummy, model, 9);
    std::vector<std::vector<float>> before;
    for (const auto& s : model.params()) before.emplace_back(model.param(s.name), model.param(s.name) + s.numel());
    OptimizerParams p;
    p.learning_rate = 1e-2f;
    p.weight_decay = 0.1f;
    p.grad_clip = 0.5f;
    for (int step = 1; step <= 2; ++step) {
        const test::TokenBatch tb = test::random_batch(2, 5, cfg.vocab_size, 50 + step);
        model.forward_backward(tb.view(), 1.0f);
        p.step = step;
        model.optimizer_step(p);
    }
    for (size_t i = 0; i < model.params().size(); ++i) {
        const ParamSpec& s = model.params()[i];
        const bool moved = std::memcmp(before[i].data(), model.param(s.name), sizeof(float) * s.numel()) != 0;
        EXPECT_EQ(moved, s.kind == ParamKind::Norm) << s.name;
        if (s.kind == ParamKind::Norm) EXPECT_EQ(model.param(s.name), model.param(kPeftPrefix + s.name)) << s.name;
    }
}

// The plan (--plan-only) counts the trained tensors' gradients and moments with the adapters'.
TEST(CpuLoraTrainAlso, MemoryPlanCountsTheTrainedTensors) {
    const ModelConfig cfg = test::tiny_qwen3_config(false);
    auto bytes_of = [](const MemoryPlan& plan, const std::string& category) -> int64_t {
        for (const auto& e : plan.entries)
            if (e.category == category) return static_cast<int64_t>(e.device_bytes);
        return -1;
    };
    const MemoryPlan plain = CpuModel::plan(cfg, train_also_options(0));
    const MemoryPlan also = CpuModel::plan(cfg, train_also_options(kTrainNorms | kTrainEmbeddings));
    int64_t extra = 0;
    for (const std::string& name : expected_trained(cfg, kTrainNorms | kTrainEmbeddings))
        for (const ParamSpec& s : model_parameters(cfg))
            if (s.name == name) extra += s.numel();
    // 2 layers x (2 norms + q/k norms) x head or hidden size, the final norm, embeddings and head
    EXPECT_EQ(extra, 2 * (2 * cfg.hidden_size + 2 * cfg.head_dim) + cfg.hidden_size +
                         2 * int64_t{cfg.vocab_size} * cfg.hidden_size);
    for (const char* c : {"LoRA adapters", "Gradients", "Adam M", "Adam V"})
        EXPECT_EQ(bytes_of(also, c) - bytes_of(plain, c), extra * 4) << c;
    EXPECT_EQ(bytes_of(also, "Weights"), bytes_of(plain, "Weights"));
}

TEST(CpuLoraTrainAlso, ParsesAndRefusesUnknownNames) {
    EXPECT_EQ(parse_lora_train_also("", "--train-also"), 0u);
    EXPECT_EQ(parse_lora_train_also("norms,embeddings", "--train-also"), kTrainNorms | kTrainEmbeddings);
    EXPECT_EQ(lora_train_also_text(kTrainEmbeddings), "embeddings");
    try {
        parse_lora_train_also("norms,heads", "--train-also");
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--train-also=norms,heads: unknown entry 'heads'"), std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace qtrain
