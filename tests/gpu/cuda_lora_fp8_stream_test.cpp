// LoRA's frozen base streamed from host memory (--shard-weights under LoRA on one GPU). With FP8
// gradients the FP8 base (fp8_base_streamed in gpu_buffers.h): the layers' e4m3 codes live in pinned
// host memory and pass through two device slots, copied one layer ahead on the weights role's copy
// stream; otherwise the bf16 base, streamed as the full model streams its weights (quantised on
// arrival with e4m3 matmuls). The GEMMs must read the bytes the resident base holds, so against the
// resident base: the stored codes and scales, one pass's adapter gradients, three AdamW steps of two
// micro-batches (losses, norms, every adapter's master and moments), an evaluation, the logits and the
// exported PEFT adapter are the same bits, for each family, e4m3 and e5m2 gradients (and the bf16 base
// with bf16 or e4m3 matmuls), recompute off and --recompute-block, dropout on (its masks are drawn per
// pass) and, in one case, the FP8 LM head and --train-also=norms.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/rng.h"
#include "cuda_lora_fixture.h"
#include "gpu_model_fixture.h"
#include "model/cuda/gpu_buffers.h"
#include "model/lora.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

// lora_options, fp8_base_options, kLoraFamilies, start_lora_models, expect_same_pass_gradients and
// expect_lora_steps_equal: cuda_lora_fixture.h.

// A bf16 model on the FP8 base with `grad` gradients, resident or streamed (--shard-weights); `matmul`:
// bf16 for the bf16 base.
ModelOptions fp8_base(DType grad, int B, int T, const LoraOptions& lora, bool streamed, DType matmul = DType::E4M3) {
    ModelOptions o = fp8_base_options(matmul, grad, B, T, lora);
    o.shard_weights = streamed;
    return o;
}

// The streamed model against the resident one, both started alike: one pass's gradients, three steps of
// two micro-batches, the trained state, an evaluation, the logits and the exported adapter.
void expect_streamed_equals_resident(CudaModel& streamed, CudaModel& resident, const ModelConfig& cfg, int B, int T) {
    expect_same_pass_gradients(streamed, resident, cfg, B, T, 71);
    streamed.zero_gradients();
    resident.zero_gradients();
    const std::vector<StepStats> stats = expect_lora_steps_equal(streamed, resident, cfg, B, T);
    for (std::size_t i = 0; i < stats.size(); ++i) EXPECT_GT(stats[i].grad_norm, 0.0f) << "step " << i + 1;
    const Tokens e = random_tokens(B, T, cfg.vocab_size, 999, Masked::Every11thFrom3);
    EXPECT_EQ(streamed.logits(e.batch(B, T)), resident.logits(e.batch(B, T)));
    TempDir dir;
    streamed.save_hf(dir.file("streamed"));
    resident.save_hf(dir.file("resident"));
    for (const char* f : {kAdapterConfigFile, kAdapterWeightsFile})
        EXPECT_EQ(read_file(dir.file("streamed") + "/" + f), read_file(dir.file("resident") + "/" + f)) << f;
}

}  // namespace

// The options select the streamed layout (runs on the CPU).
TEST(CudaLoraFp8Stream, OptionsSelectTheStreamedBase) {
    const LoraOptions lora = lora_options(0.0f);
    const ModelOptions s = fp8_base(DType::E5M2, 2, 48, lora, true);
    EXPECT_TRUE(fp8_base_streamed(s));
    // (the bf16 base streams as the full model does: its bf16 weights in host memory)
    EXPECT_FALSE(fp8_base_streamed(fp8_base(DType::BF16, 2, 48, lora, true)));
    EXPECT_TRUE(weights_on_host(fp8_base(DType::BF16, 2, 48, lora, true)));
    EXPECT_TRUE(fp8_base_transposes_in_backward(s));
    // the model-dtype tensors (norms, embedding, head) stay resident: only the codes are on the host
    EXPECT_FALSE(weights_on_host(s));
    EXPECT_FALSE(embedding_weights_on_host(llama_case(), s));
    EXPECT_FALSE(streamed_quants_persist(s));
    EXPECT_FALSE(fp8_base_streamed(fp8_base(DType::E5M2, 2, 48, lora, false)));
    // (the full model's streaming is unchanged)
    ModelOptions full = fp8_base(DType::E5M2, 2, 48, LoraOptions{}, true);
    EXPECT_FALSE(fp8_base_streamed(full));
    EXPECT_TRUE(weights_on_host(full));
    EXPECT_TRUE(embedding_weights_on_host(llama_case(), full));
}

// The load wrote the resident base's codes and scales to the host.
TEST(CudaLoraFp8Stream, HostCodesAreTheResidentCodes) {
    QTRAIN_REQUIRE_GPU();
    for (const FamilyCase& f : kLoraFamilies) {
        SCOPED_TRACE(f.name);
        const ModelConfig cfg = f.make();
        CudaModel streamed(cfg, fp8_base(DType::E4M3, 2, 48, lora_options(0.0f), true));
        CudaModel resident(cfg, fp8_base(DType::E4M3, 2, 48, lora_options(0.0f), false));
        start_lora_models({&streamed, &resident}, 21, 22);
        for (int l = 0; l < cfg.num_hidden_layers; ++l)
            for (int mi = 0; mi < 4; ++mi) {
                const Matrix m = static_cast<Matrix>(mi);
                SCOPED_TRACE(testing::Message() << "layer " << l << " matrix " << mi);
                const std::vector<uint8_t> q = streamed.download_fp8_matrix(l, m, false);
                EXPECT_EQ(q, resident.download_fp8_matrix(l, m, false));
                int nonzero = 0;
                for (uint8_t c : q) nonzero += c != 0;
                EXPECT_GT(nonzero, static_cast<int>(q.size() / 2));
                EXPECT_EQ(streamed.fp8_matrix_scale(l, m), resident.fp8_matrix_scale(l, m));
            }
    }
}

// Every family, e4m3 and e5m2 gradients, recompute off and --recompute-block, dropout on.
TEST(CudaLoraFp8Stream, StepsBitIdenticalToResidentBase) {
    QTRAIN_REQUIRE_GPU();
    const int B = 2, T = 48;
    for (const FamilyCase& f : kLoraFamilies) {
        const ModelConfig cfg = f.make();
        for (DType grad : {DType::E4M3, DType::E5M2})
            for (bool recompute : {false, true}) {
                SCOPED_TRACE(std::string(f.name) + " " + std::string(dtype_name(grad)) +
                             (recompute ? " --recompute-block" : ""));
                ModelOptions s = fp8_base(grad, B, T, lora_options(0.2f), true);
                ModelOptions r = fp8_base(grad, B, T, lora_options(0.2f), false);
                s.recompute_block = r.recompute_block = recompute;
                CudaModel streamed(cfg, s), resident(cfg, r);
                start_lora_models({&streamed, &resident}, 9, 10);
                expect_streamed_equals_resident(streamed, resident, cfg, B, T);
            }
    }
}

// The bf16 base streamed (bf16 weights in pinned host memory, the full model's streaming), with bf16
// matmuls and with e4m3 matmuls on bf16 gradients (each layer quantised as it arrives, the codes and
// scales of the resident base's one quantisation): every family, recompute off and on. Llama is untied:
// its embedding rows are read from the pinned copy.
TEST(CudaLoraFp8Stream, Bf16BaseStepsBitIdenticalToResidentBase) {
    QTRAIN_REQUIRE_GPU();
    const int B = 2, T = 48;
    for (const FamilyCase& f : kLoraFamilies) {
        const ModelConfig cfg = f.make();
        for (DType matmul : {DType::BF16, DType::E4M3})
            for (bool recompute : {false, true}) {
                SCOPED_TRACE(std::string(f.name) + " --matmul-dtype=" + std::string(dtype_name(matmul)) +
                             (recompute ? " --recompute-block" : ""));
                ModelOptions s = fp8_base(DType::BF16, B, T, lora_options(0.2f), true, matmul);
                ModelOptions r = fp8_base(DType::BF16, B, T, lora_options(0.2f), false, matmul);
                s.recompute_block = r.recompute_block = recompute;
                ASSERT_FALSE(fp8_base_streamed(s));
                ASSERT_TRUE(weights_on_host(s));
                CudaModel streamed(cfg, s), resident(cfg, r);
                start_lora_models({&streamed, &resident}, 9, 10);
                expect_streamed_equals_resident(streamed, resident, cfg, B, T);
            }
    }
}

// --train-also with the bf16 base streamed on one GPU (session 24): the trained norms and embeddings are
// written into the base's pinned host copy after each update and the device copies refreshed from it (its
// resident tensors, the layer slots): the same bits as the resident base, every family (Llama untied: its
// trained embedding rows read from the pinned copy), with bf16 and e4m3 matmuls.
TEST(CudaLoraFp8Stream, Bf16BaseTrainsAlsoBitIdenticalToResidentBase) {
    QTRAIN_REQUIRE_GPU();
    const int B = 2, T = 48;
    // (norms alone: only their ranges are refreshed after a write, Weights::changed(ranges); the final norm is
    // resident, the layers' norms come with their slots)
    for (const uint32_t also : {kTrainNorms | kTrainEmbeddings, kTrainNorms})
        for (const FamilyCase& f : kLoraFamilies) {
            LoraOptions lora = lora_options(0.0f);
            lora.train_also = also;
            const ModelConfig cfg = f.make();
            for (DType matmul : {DType::BF16, DType::E4M3}) {
                SCOPED_TRACE(std::string(f.name) + " --matmul-dtype=" + std::string(dtype_name(matmul)) +
                             (also & kTrainEmbeddings ? " norms,embeddings" : " norms"));
                ModelOptions s = fp8_base(DType::BF16, B, T, lora, true, matmul);
                ModelOptions r = fp8_base(DType::BF16, B, T, lora, false, matmul);
                ASSERT_TRUE(weights_on_host(s));
                CudaModel streamed(cfg, s), resident(cfg, r);
                start_lora_models({&streamed, &resident}, 17, 18);
                expect_streamed_equals_resident(streamed, resident, cfg, B, T);
            }
        }
}

// The FP8 LM head (resident, quantised once) and --train-also=norms (the trained norms are resident
// model-dtype tensors, written by the adapters' AdamW) with the streamed base; --recompute-ffn.
TEST(CudaLoraFp8Stream, Fp8HeadAndTrainedNormsBitIdentical) {
    QTRAIN_REQUIRE_GPU();
    const int B = 2, T = 48;
    ModelConfig cfg = qwen3_case();
    cfg.vocab_size = 112;  // the FP8 head needs a vocabulary that is a multiple of 16 (qwen3_case has 97)
    cfg.validate("test");
    LoraOptions lora = lora_options(0.0f);
    lora.train_also = kTrainNorms;
    ModelOptions s = fp8_base(DType::E5M2, B, T, lora, true), r = fp8_base(DType::E5M2, B, T, lora, false);
    s.fp8_lm_head = r.fp8_lm_head = true;
    s.recompute_ffn = r.recompute_ffn = true;
    CudaModel streamed(cfg, s), resident(cfg, r);
    start_lora_models({&streamed, &resident}, 13, 14);
    expect_streamed_equals_resident(streamed, resident, cfg, B, T);
}

// What stays refused names its flags, before any memory is taken: CUDA graphs at ZeRO-3 of the base,
// persistent / offloaded quants (the codes are on the host already). (CUDA graphs with the streamed base:
// cuda_graphs_stream_test.cpp; --train-also with ZeRO-3 of the bf16 base runs: cuda_lora_zero3_test.cpp.)
TEST(CudaLoraFp8Stream, RefusalsNameTheirFlags) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen2_case();
    // (with --gpus=2, --shard-weights is ZeRO-3 of the base, cuda_lora_zero3_test.cpp; its layer gathers
    // are collectives a CUDA graph does not capture)
    ModelOptions two = fp8_base(DType::E5M2, 2, 48, lora_options(0.0f), true);
    two.gpus = 2;
    two.use_cuda_graphs = true;
    EXPECT_ERROR((void)CudaModel(cfg, two), "--use-cuda-graphs", "--shard-weights", "--gpus=1");
    ModelOptions pq = fp8_base(DType::E5M2, 2, 48, lora_options(0.0f), true);
    pq.persistent_quants = true;
    EXPECT_ERROR((void)CudaModel(cfg, pq), "--lora-rank=8", "--persistent-quants");
    pq.offload_quants = true;
    EXPECT_ERROR((void)CudaModel(cfg, pq), "--lora-rank=8", "--offload-quants");
}
