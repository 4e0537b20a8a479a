// The CPU model's emulation of the FP8 LM head (--lm-head-dtype=e4m3, ModelOptions::fp8_lm_head):
// the reference tests/gpu/fp8_lm_head_test.cpp compares the GPU with. Here: it is refused without
// FP8 matmuls, it is active (the loss and the head's gradient move), it moves them only slightly
// against the model-dtype head, and it is exactly reproducible; tied and untied heads, one and
// several LM-head chunks, with and without FP8 gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cpu_test_util.h"
#include "model/cpu/cpu_ops.h"
#include "model/cpu/cpu_model.h"
#include "test_util.h"

namespace qtrain {
namespace {

struct HeadRun {
    std::vector<float> grads;  // every gradient, in the parameters' order
    std::vector<float> head;   // the LM head's (the embedding's when tied)
    double loss = 0, eval = 0;
};

double cosine_of(const std::vector<float>& a, const std::vector<float>& b) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < a.size(); ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
    return ab / std::sqrt(aa * bb + 1e-300);
}

HeadRun run(const ModelConfig& cfg, const ModelOptions& o, const test::TokenBatch& tb) {
    CpuModel m(cfg, o);
    m.init_random(17);
    HeadRun r;
    r.eval = m.evaluate_f64(tb.view());
    m.forward_backward(tb.view(), 1.0f);
    r.loss = m.step_loss();
    const std::string head = cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    for (const auto& s : m.params()) {
        const float* g = m.grad(s.name);
        r.grads.insert(r.grads.end(), g, g + s.numel());
        if (s.name == head) r.head.assign(g, g + s.numel());
    }
    return r;
}

// The op's FP8 path only swaps the GEMM operands: given the unquantised x and head as its "quantised"
// ones and fp32 gradients it is the plain op bit for bit (so the flag off, which passes no LmHeadFp8,
// runs what ran before); given real FP8 operands it changes the loss.
TEST(CpuFp8LmHead, TheOpsFp8PathOnlySwapsTheOperands) {
    const int N = 24, C = 16, V = 37, chunks = 3;
    Rng rng(5);
    std::vector<float> x(N * C), w(V * C);
    for (float& v : x) v = rng.uniform() * 2 - 1;
    for (float& v : w) v = (rng.uniform() * 2 - 1) * 0.3f;
    std::vector<int32_t> targets(N);
    for (int i = 0; i < N; ++i) targets[i] = i % 5 == 2 ? -1 : static_cast<int32_t>(rng.below(V));
    auto op = [&](const cpu::LmHeadFp8* fp8, std::vector<float>& losses, std::vector<float>& dx, std::vector<float>& dw) {
        losses.assign(N, 0), dx.assign(N * C, 0), dw.assign(V * C, 0);
        std::vector<float> scratch(static_cast<size_t>(cpu::lmhead_chunk_rows(N, chunks)) * V);
        cpu::lmhead_cross_entropy(losses.data(), dx.data(), dw.data(), x.data(), w.data(), targets.data(), N, C, V,
                                  chunks, 0.05f, scratch.data(), fp8);
    };
    std::vector<float> l0, dx0, dw0, l1, dx1, dw1;
    op(nullptr, l0, dx0, dw0);
    const cpu::LmHeadFp8 same{x.data(), w.data(), DType::F32};
    op(&same, l1, dx1, dw1);
    EXPECT_EQ(l1, l0);
    EXPECT_EQ(dx1, dx0);
    EXPECT_EQ(dw1, dw0);
    std::vector<float> xq(x.size()), wq(w.size());
    cpu::fake_quantize({{x.data(), xq.data(), N * C}}, DType::E4M3);
    cpu::fake_quantize({{w.data(), wq.data(), V * C}}, DType::E4M3);
    const cpu::LmHeadFp8 fp8{xq.data(), wq.data(), DType::E5M2};
    op(&fp8, l1, dx1, dw1);
    EXPECT_NE(l1, l0);
    EXPECT_NE(dw1, dw0);
}

TEST(CpuFp8LmHead, RefusedWithoutFp8Matmuls) {
    ModelOptions o = CpuModel::fp32_options(2, 8);
    o.fp8_lm_head = true;
    EXPECT_ERROR(CpuModel(test::tiny_config(true), o), "--lm-head-dtype=e4m3", "--matmul-dtype=e4m3");
    o.matmul_dtype = DType::E4M3;
    EXPECT_NO_THROW(CpuModel(test::tiny_config(true), o));
}

TEST(CpuFp8LmHead, ActiveCloseToTheModelDtypeHeadAndReproducible) {
    for (bool tied : {true, false}) {
        ModelConfig cfg = test::tiny_config(tied);
        cfg.initializer_range = 0.2;  // gradients well above rounding noise in every tensor
        const test::TokenBatch tb = test::random_batch(3, 16, cfg.vocab_size, tied ? 31 : 32, 7);
        for (DType grad : {DType::BF16, DType::E4M3, DType::E5M2}) {
            for (int chunks : {1, 3}) {
                const std::string what = std::string(tied ? "tied" : "untied") + " grads " +
                                         std::string(dtype_name(grad)) + " chunks " + std::to_string(chunks);
                SCOPED_TRACE(what);
                ModelOptions o = CpuModel::fp32_options(3, 16);
                o.matmul_dtype = DType::E4M3;
                o.gradient_dtype = grad;  // bf16 with e4m3 matmuls: gradients not quantised (CpuModel::check_options)
                o.lmhead_chunks = chunks;
                const HeadRun plain = run(cfg, o, tb);
                o.fp8_lm_head = true;
                const HeadRun fp8 = run(cfg, o, tb);
                // active: the logits carry FP8 rounding, so the loss and the head's gradient move
                EXPECT_NE(fp8.loss, plain.loss);
                EXPECT_NE(fp8.head, plain.head);
                // slightly: the loss within 1%, every gradient together and the head's own close
                EXPECT_NEAR(fp8.loss, plain.loss, 0.01 * plain.loss);
                EXPECT_GT(cosine_of(fp8.grads, plain.grads), 0.98);
                EXPECT_GT(cosine_of(fp8.head, plain.head), 0.98);
                // the evaluation runs the same FP8 forward (the micro-batch mean, grad_scale 1)
                EXPECT_NEAR(fp8.eval, fp8.loss, 1e-6 * fp8.loss);
                // exactly reproducible
                const HeadRun again = run(cfg, o, tb);
                EXPECT_EQ(again.loss, fp8.loss);
                EXPECT_EQ(again.grads, fp8.grads);
                std::printf("[cpu fp8 lm head %s] loss %.6f vs %.6f, grad cosine %.6f, head grad cosine %.6f\n",
                            what.c_str(), fp8.loss, plain.loss, cosine_of(fp8.grads, plain.grads),
                            cosine_of(fp8.head, plain.head));
            }
        }
    }
}

// With FP8 gradients each LM-head chunk's d(logits) is quantised with its own scale (as on the GPU):
// four chunks give another head gradient than one (other scales, another summation order), close to
// it; the forward quantises x and the head as whole tensors, so the loss does not depend on the split.
TEST(CpuFp8LmHead, ChunksKeepTheLossAndMoveTheHeadGradientSlightly) {
    ModelConfig cfg = test::tiny_config(false);
    cfg.initializer_range = 0.2;
    const test::TokenBatch tb = test::random_batch(4, 16, cfg.vocab_size, 33);
    ModelOptions o = CpuModel::fp32_options(4, 16);
    o.matmul_dtype = DType::E4M3;
    o.gradient_dtype = DType::E5M2;
    o.fp8_lm_head = true;
    const HeadRun one = run(cfg, o, tb);
    o.lmhead_chunks = 4;
    const HeadRun four = run(cfg, o, tb);
    EXPECT_NEAR(four.loss, one.loss, 1e-6 * one.loss);
    EXPECT_NE(four.head, one.head);
    EXPECT_GT(cosine_of(four.head, one.head), 0.98);
}

}  // namespace
}  // namespace qtrain
