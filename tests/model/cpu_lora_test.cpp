// LoRA on the CPU reference model (issue 33): the adapter op against finite differences, whole-model
// adapter gradients on the Qwen2, Qwen3 and Llama blocks, and a frozen base under AdamW.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/lora_dropout.h"
#include "core/rng.h"
#include "cpu_test_util.h"
#include "model/cpu/cpu_model.h"
#include "model/cpu/cpu_ops.h"

namespace qtrain {
namespace {

using test::expect_gradient;
using test::Near;
using test::richardson_difference;
using test::weighted_sum;

TEST(CpuLoraOps, ForwardMatchesDefinitionAndBackwardMatchesFiniteDifferences) {
    const int N = 5, IC = 7, OC = 6, r = 3;
    const float s = 1.7f;
    auto x = test::random_vector(N * IC, 1), A = test::random_vector(r * IC, 2), B = test::random_vector(OC * r, 3);
    const auto y0 = test::random_vector(N * OC, 4), w = test::random_vector(N * OC, 5);
    std::vector<float> y = y0, h(N * r);
    cpu::lora_forward(y.data(), h.data(), x.data(), A.data(), B.data(), N, IC, OC, r, s);
    for (int n = 0; n < N; ++n)
        for (int o = 0; o < OC; ++o) {
            double ref = 0.0;
            for (int k = 0; k < r; ++k) {
                double xa = 0.0;
                for (int i = 0; i < IC; ++i) xa += static_cast<double>(x[n * IC + i]) * A[k * IC + i];
                ref += xa * B[o * r + k];
            }
            EXPECT_TRUE(Near(y[n * OC + o], y0[n * OC + o] + s * ref, 1e-6, 1e-6)) << n << "," << o;
        }
    // the backward adds: start from ones and subtract them afterwards
    std::vector<float> dx(N * IC, 1.0f), dA(r * IC, 1.0f), dB(OC * r, 1.0f), dh(N * r);
    cpu::lora_backward(dx.data(), dA.data(), dB.data(), dh.data(), w.data(), x.data(), h.data(), A.data(), B.data(), N,
                       IC, OC, r, s);
    for (auto* g : {&dx, &dA, &dB})
        for (auto& v : *g) v -= 1.0f;
    auto loss = [&] {
        std::vector<float> out = y0, hh(N * r);
        cpu::lora_forward(out.data(), hh.data(), x.data(), A.data(), B.data(), N, IC, OC, r, s);
        return weighted_sum(out, w);
    };
    expect_gradient("dx", x, dx, loss);
    expect_gradient("dA", A, dA, loss);
    expect_gradient("dB", B, dB, loss);
}

// Base weights away from init (as cpu_model_grad_test) and adapters with non-zero B, so every
// adapter path carries signal.
void randomize(CpuModel& m, uint64_t seed) {
    Rng rng(seed);
    for (const auto& s : m.params()) {
        float* p = m.param(s.name);
        for (int64_t i = 0; i < s.numel(); ++i) {
            const float z = rng.normal();
            p[i] = s.kind == ParamKind::Norm ? 1.0f + 0.2f * z : s.kind == ParamKind::Bias ? 0.2f * z : 0.3f * z;
        }
    }
    for (const auto& s : m.lora().specs()) {
        float* p = m.param(s.name);
        for (int64_t i = 0; i < s.numel(); ++i) p[i] = 0.3f * rng.normal();
    }
}

ModelOptions lora_options(int rank, float alpha, uint32_t targets = 0x7f) {
    ModelOptions opt = CpuModel::fp32_options(2, 5);
    opt.lmhead_chunks = 2;
    opt.lora.rank = rank;
    opt.lora.alpha = alpha;
    opt.lora.targets = targets;
    return opt;
}

void check_adapter_gradients(const ModelConfig& cfg) {
    CpuModel model(cfg, lora_options(3, 5.0f));
    randomize(model, 42);
    const test::TokenBatch tb = test::random_batch(2, 5, cfg.vocab_size, 7, /*mask_every=*/3);
    const Batch batch = tb.view();
    model.forward_backward(batch, 1.0f);
    auto loss = [&] { return model.evaluate_f64(batch); };
    const double h = 2e-2, rtol = 1e-3, atol = 3e-5;
    Rng pick(99);
    ASSERT_EQ(model.lora().specs().size(), static_cast<size_t>(2 * kLoraTargets * cfg.num_hidden_layers));
    for (const auto& s : model.lora().specs()) {
        const float* g = model.grad(s.name);
        float* p = model.param(s.name);
        int64_t largest = 0;
        for (int64_t i = 1; i < s.numel(); ++i)
            if (std::abs(g[i]) > std::abs(g[largest])) largest = i;
        EXPECT_GT(std::abs(g[largest]), 1e-3) << s.name << ": gradient is (almost) zero everywhere";
        std::vector<int64_t> idx = {largest};
        for (int k = 0; k < 3; ++k) idx.push_back(static_cast<int64_t>(pick.below(s.numel())));
        for (int64_t i : idx) EXPECT_TRUE(Near(g[i], richardson_difference(loss, p + i, h), rtol, atol)) << s.name << "[" << i << "]";
    }
}

TEST(CpuLoraModel, AdapterGradientsMatchFiniteDifferencesQwen2) { check_adapter_gradients(test::tiny_config(false)); }
TEST(CpuLoraModel, AdapterGradientsMatchFiniteDifferencesQwen3) {
    check_adapter_gradients(test::tiny_qwen3_config(true));
}
TEST(CpuLoraModel, AdapterGradientsMatchFiniteDifferencesLlama) {
    check_adapter_gradients(test::tiny_llama_config(false));
}

// Adapter names and shapes as PEFT saves them: A [r, in], B [out, r]; only the chosen targets.
TEST(CpuLoraModel, AdaptersHavePeftNamesAndShapes) {
    const ModelConfig cfg = test::tiny_qwen3_config(false);
    const uint32_t q_and_down = (1u << static_cast<int>(LoraTarget::Q)) | (1u << static_cast<int>(LoraTarget::Down));
    CpuModel model(cfg, lora_options(4, 8.0f, q_and_down));
    const auto& specs = model.lora().specs();
    ASSERT_EQ(specs.size(), 2u * 2u * cfg.num_hidden_layers);
    EXPECT_EQ(specs[0].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{4, cfg.hidden_size}));
    EXPECT_EQ(specs[1].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
    EXPECT_EQ(specs[1].shape, (std::vector<int64_t>{cfg.q_dim(), 4}));
    EXPECT_EQ(specs[3].name, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight");
    EXPECT_EQ(specs[3].shape, (std::vector<int64_t>{cfg.hidden_size, 4}));
    EXPECT_EQ(specs[2].shape, (std::vector<int64_t>{4, cfg.intermediate_size}));
}

// PEFT's default init: B = 0, so fresh adapters give the base model's loss to the bit; A is
// uniform in +-1/sqrt(in) and not all zero.
TEST(CpuLoraModel, FreshAdaptersLeaveTheBaseLossUnchanged) {
    const ModelConfig cfg = test::tiny_config(false);
    CpuModel base(cfg, CpuModel::fp32_options(2, 5));
    CpuModel lora(cfg, lora_options(2, 8.0f));
    base.init_random(5);
    lora.init_random(5);
    for (const auto& s : base.params()) {
        float* p = base.param(s.name);
        for (int64_t i = 0; i < s.numel(); ++i) p[i] += 0.05f * static_cast<float>((i * 7 + 3) % 11 - 5);
        std::copy(p, p + s.numel(), lora.param(s.name));
    }
    const test::TokenBatch tb = test::random_batch(2, 5, cfg.vocab_size, 3);
    EXPECT_EQ(base.evaluate_f64(tb.view()), lora.evaluate_f64(tb.view()));
    for (const auto& s : lora.lora().specs()) {
        const float* p = lora.param(s.name);
        const bool is_a = s.name.find("lora_A") != std::string::npos;
        const float bound = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
        float amax = 0.0f;
        for (int64_t i = 0; i < s.numel(); ++i) amax = std::max(amax, std::abs(p[i]));
        if (is_a) {
            EXPECT_GT(amax, 0.3f * bound) << s.name;
            EXPECT_LE(amax, bound) << s.name;
        } else {
            EXPECT_EQ(amax, 0.0f) << s.name;
        }
    }
}

// AdamW moves the adapters only: the base is bit-identical after steps with weight decay, has no
// gradient, and the memory plan holds no gradient or moments for it.
TEST(CpuLoraModel, BaseStaysFrozenWhileAdaptersTrain) {
    const ModelConfig cfg = test::tiny_llama_config(true);
    CpuModel model(cfg, lora_options(2, 16.0f));
    randomize(model, 11);
    std::vector<std::vector<float>> base, adapters;
    for (const auto& s : model.params()) base.emplace_back(model.param(s.name), model.param(s.name) + s.numel());
    for (const auto& s : model.lora().specs())
        adapters.emplace_back(model.param(s.name), model.param(s.name) + s.numel());
    OptimizerParams p;
    p.learning_rate = 1e-2f;
    p.weight_decay = 0.1f;
    p.grad_clip = 1.0f;
    for (int step = 1; step <= 3; ++step) {
        const test::TokenBatch tb = test::random_batch(2, 5, cfg.vocab_size, 100 + step);
        model.forward_backward(tb.view(), 1.0f);
        p.step = step;
        const StepStats stats = model.optimizer_step(p);
        EXPECT_GT(stats.grad_norm, 0.0f);
        EXPECT_TRUE(std::isfinite(stats.loss));
    }
    for (size_t i = 0; i < model.params().size(); ++i) {
        const auto& s = model.params()[i];
        EXPECT_EQ(0, std::memcmp(base[i].data(), model.param(s.name), sizeof(float) * s.numel())) << s.name;
        EXPECT_THROW(model.grad(s.name), Error) << s.name;
    }
    for (size_t i = 0; i < model.lora().specs().size(); ++i) {
        const auto& s = model.lora().specs()[i];
        EXPECT_NE(0, std::memcmp(adapters[i].data(), model.param(s.name), sizeof(float) * s.numel())) << s.name;
    }
    int64_t adapter_floats = 0;
    for (const auto& s : model.lora().specs()) adapter_floats += s.numel();
    const MemoryPlan plan = model.memory_plan();
    auto bytes_of = [&](const std::string& category) -> int64_t {
        for (const auto& e : plan.entries)
            if (e.category == category) return static_cast<int64_t>(e.device_bytes);
        return -1;
    };
    const int64_t adapter_bytes = adapter_floats * static_cast<int64_t>(sizeof(float));
    EXPECT_EQ(bytes_of("LoRA adapters"), adapter_bytes);
    for (const char* c : {"Gradients", "Adam M", "Adam V"}) EXPECT_EQ(bytes_of(c), adapter_bytes) << c;
    EXPECT_EQ(bytes_of("Weights"), cfg.num_parameters() * static_cast<int64_t>(sizeof(float)));
}

TEST(CpuLoraModel, BadOptionsNameTheFlag) {
    const ModelConfig cfg = test::tiny_config(false);  // k/v are [8, 16]
    auto message = [&](const ModelOptions& o) -> std::string {
        try {
            CpuModel m(cfg, o);
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    const std::string rank = message(lora_options(9, 8.0f));
    EXPECT_NE(rank.find("--lora-rank=9"), std::string::npos) << rank;
    EXPECT_NE(rank.find("k_proj"), std::string::npos) << rank;
    // only q and o (both 16 wide): rank 9 fits
    EXPECT_EQ(message(lora_options(9, 8.0f, 0b1001)), "");
    ModelOptions fp8 = lora_options(2, 8.0f);  // the FP8 base (cpu_lora_fp8_test.cpp) is not refused
    fp8.matmul_dtype = DType::E4M3;
    EXPECT_EQ(message(fp8), "");
    fp8.gpus = 2;  // several ranks too (cpu_lora_data_parallel_test.cpp's FP8-base case)
    EXPECT_EQ(message(fp8), "");
    ModelOptions dropout = lora_options(2, 8.0f);
    dropout.lora.dropout = 1.0f;
    EXPECT_NE(message(dropout).find("--lora-dropout must be in [0, 1)"), std::string::npos);
}

// Dropout on the adapters' input: the gradients are those of the training pass's loss with its
// masks (replayed by resetting the pass count), the masks change from pass to pass and with the
// seed, drop about p of the inputs, and evaluation uses no dropout.
TEST(CpuLoraModel, DropoutGradientsMatchFiniteDifferencesOfTheTrainingPass) {
    const ModelConfig cfg = test::tiny_qwen3_config(false);
    ModelOptions opt = lora_options(3, 5.0f);
    opt.lora.dropout = 0.3f;
    opt.lora.seed = 17;
    CpuModel model(cfg, opt);
    randomize(model, 42);
    const test::TokenBatch tb = test::random_batch(2, 5, cfg.vocab_size, 7, /*mask_every=*/3);
    const Batch batch = tb.view();
    model.lora().set_passes(5);
    model.forward_backward(batch, 1.0f);
    EXPECT_EQ(model.lora().passes(), 6u);
    std::vector<std::vector<float>> grads;
    for (const auto& s : model.lora().specs()) grads.emplace_back(model.grad(s.name), model.grad(s.name) + s.numel());
    // the loss of pass 5 again (its gradients are accumulated elsewhere and ignored)
    auto loss = [&] {
        model.lora().set_passes(5);
        const double before = model.step_loss();
        model.forward_backward(batch, 1.0f);
        return model.step_loss() - before;
    };
    const double h = 2e-2, rtol = 1e-3, atol = 3e-5;
    Rng pick(3);
    for (size_t k = 0; k < model.lora().specs().size(); ++k) {
        const auto& s = model.lora().specs()[k];
        float* p = model.param(s.name);
        int64_t largest = 0;
        for (int64_t i = 1; i < s.numel(); ++i)
            if (std::abs(grads[k][i]) > std::abs(grads[k][largest])) largest = i;
        for (int64_t i : {largest, static_cast<int64_t>(pick.below(s.numel()))})
            EXPECT_TRUE(Near(grads[k][i], richardson_difference(loss, p + i, h), rtol, atol)) << s.name << "[" << i << "]";
    }

    // another pass, another mask: another loss; the same pass and seed: the same loss to the bit
    auto pass_loss = [&](CpuModel& m, uint64_t pass) {
        m.lora().set_passes(pass);
        const double before = m.step_loss();
        m.forward_backward(batch, 1.0f);
        return m.step_loss() - before;
    };
    EXPECT_NE(pass_loss(model, 5), pass_loss(model, 6));
    // fresh models (step loss 0, so the pass's loss is exact): same seed and pass, the same bits
    ModelOptions other = opt, no_dropout = opt;
    other.lora.seed = 18;
    no_dropout.lora.dropout = 0.0f;
    CpuModel first(cfg, opt), twin(cfg, opt), other_seed(cfg, other), plain(cfg, no_dropout);
    for (CpuModel* m : {&first, &twin, &other_seed, &plain}) randomize(*m, 42);
    // evaluation: no dropout, as a model without it
    EXPECT_EQ(first.evaluate_f64(batch), plain.evaluate_f64(batch));
    const double loss9 = pass_loss(first, 9);
    EXPECT_EQ(loss9, pass_loss(twin, 9));
    EXPECT_NE(loss9, pass_loss(other_seed, 9));
    EXPECT_NE(loss9, pass_loss(plain, 9));
}


// The dropout mask's per-element form (core/lora_dropout.h, which the GPU kernels compute element by
// element) is the sequential splitmix64 stream the mask is defined by: a stream seeded from
// (seed, pass, slot), element i its i-th uniform. Checked against core/rng.h's Rng drawn in order.
TEST(LoraDropoutMask, PerElementFormIsTheSequentialStream) {
    for (const uint64_t seed : {42ull, 0x123456789abcdefull})
        for (const uint64_t pass : {0ull, 1ull, 977ull})
            for (const uint64_t slot : {0ull, 6ull, 13ull}) {
                uint64_t state = seed ^ 0x6c6f7261ull;
                state ^= splitmix64(state) + pass;
                state ^= splitmix64(state) + slot;
                Rng rng(splitmix64(state));
                const uint64_t stream = lora_dropout_stream(seed, pass, slot);
                const float p = 0.3f, keep = 1.0f / (1.0f - p);
                int dropped = 0;
                for (uint64_t i = 0; i < 4000; ++i) {
                    const float expected = rng.uniform() < p ? 0.0f : keep;
                    ASSERT_EQ(lora_dropout_scale(stream, i, p, keep), expected) << seed << " " << pass << " " << slot;
                    dropped += expected == 0.0f;
                }
                EXPECT_NEAR(dropped / 4000.0, p, 0.04);
            }
}

}  // namespace
}  // namespace qtrain
