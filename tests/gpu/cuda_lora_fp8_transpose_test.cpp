// LoRA's FP8 base transposes its e4m3 matrices just in time (fp8_base_transposes_in_backward,
// gpu_buffers.h): the GPU keeps only the row-major codes, and the backward's input-gradient GEMM reads
// each matrix's transpose from one scratch buffer that transpose_fp8 fills right before it. Against the
// layout that kept every transposed copy (the test-only ModelOptions::fp8_base_keep_transposed, which
// runs the code path as it was): the transposed codes, every adapter gradient of a training pass, and
// three AdamW steps (losses, norms, masters, moments, an evaluation) are the same bits, for each
// family, e4m3 and e5m2 gradients, with dropout, CUDA graphs, --recompute-block and --train-also.
// The families' matrices are multiples of 16 but not of the transpose's 64-byte tiles (I = 96, 160,
// 192), so partial tiles and smaller matrices inside the larger scratch are exercised.
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
// expect_lora_steps_bit_identical: cuda_lora_fixture.h.

// A bf16 model on the FP8 base with `grad` gradients; `keep`: the kept-transposes layout.
ModelOptions fp8_base(DType grad, int B, int T, const LoraOptions& lora, bool keep) {
    ModelOptions o = fp8_base_options(DType::E4M3, grad, B, T, lora);
    o.fp8_base_keep_transposed = keep;
    return o;
}

}  // namespace

// The layouts differ as planned: the kept one has wTq and no scratch, the default the reverse.
TEST(CudaLoraFp8Transpose, OptionsSelectTheLayout) {
    const LoraOptions lora = lora_options(0.0f);
    EXPECT_TRUE(fp8_base_transposes_in_backward(fp8_base(DType::E5M2, 2, 48, lora, false)));
    EXPECT_FALSE(fp8_base_transposes_in_backward(fp8_base(DType::E5M2, 2, 48, lora, true)));
    EXPECT_TRUE(fp8_base_only(fp8_base(DType::E5M2, 2, 48, lora, true)));
    // (the bf16-gradient FP8 base and the full FP8 run never transpose in the backward)
    EXPECT_FALSE(fp8_base_transposes_in_backward(fp8_base(DType::BF16, 2, 48, lora, false)));
    EXPECT_FALSE(fp8_base_transposes_in_backward(fp8_base(DType::E5M2, 2, 48, LoraOptions{}, false)));
}

// What the input-gradient GEMM reads: the transposed codes made in the scratch equal the kept copy and
// the host transpose of the row-major codes, before and after training passes (which overwrite the
// scratch with other matrices).
TEST(CudaLoraFp8Transpose, ScratchHoldsTheKeptTransposedCodes) {
    QTRAIN_REQUIRE_GPU();
    for (const FamilyCase& f : kLoraFamilies) {
        SCOPED_TRACE(f.name);
        const ModelConfig cfg = f.make();
        const int B = 2, T = 48;
        CudaModel jit(cfg, fp8_base(DType::E5M2, B, T, lora_options(0.0f), false));
        CudaModel kept(cfg, fp8_base(DType::E5M2, B, T, lora_options(0.0f), true));
        start_lora_models({&jit, &kept}, 21, 22);
        for (int pass = 0; pass < 2; ++pass) {
            SCOPED_TRACE(pass == 0 ? "after the load" : "after a training pass");
            for (int l = 0; l < cfg.num_hidden_layers; ++l)
                for (int mi = 0; mi < 4; ++mi) {
                    const Matrix m = static_cast<Matrix>(mi);
                    SCOPED_TRACE(testing::Message() << "layer " << l << " matrix " << mi);
                    const MatrixShape g = layer_matrix(jit.layout(), cfg, l, m);
                    const std::vector<uint8_t> q = jit.download_fp8_matrix(l, m, false);
                    std::vector<uint8_t> want(q.size());
                    for (int64_t r = 0; r < g.rows; ++r)
                        for (int64_t c = 0; c < g.cols; ++c) want[c * g.rows + r] = q[r * g.cols + c];
                    const std::vector<uint8_t> t = jit.download_fp8_matrix(l, m, true);
                    EXPECT_EQ(t, want);
                    EXPECT_EQ(t, kept.download_fp8_matrix(l, m, true));
                    EXPECT_EQ(q, kept.download_fp8_matrix(l, m, false));
                }
            const Tokens d = random_tokens(B, T, cfg.vocab_size, 5, Masked::Every11thFrom3);
            jit.forward_backward(d.batch(B, T), 1.0f);
            kept.forward_backward(d.batch(B, T), 1.0f);
        }
    }
}

// Every family, e4m3 and e5m2 gradients, dropout on: one pass's gradients, then three AdamW steps of
// two micro-batches, bit for bit against the kept transposes.
TEST(CudaLoraFp8Transpose, StepsBitIdenticalToKeptTransposes) {
    QTRAIN_REQUIRE_GPU();
    for (const FamilyCase& f : kLoraFamilies) {
        const ModelConfig cfg = f.make();
        const int B = 2, T = 48;
        for (DType grad : {DType::E4M3, DType::E5M2}) {
            SCOPED_TRACE(std::string(f.name) + " " + std::string(dtype_name(grad)));
            const ModelOptions jit_o = fp8_base(grad, B, T, lora_options(0.2f), false);
            const ModelOptions kept_o = fp8_base(grad, B, T, lora_options(0.2f), true);
            {
                CudaModel jit(cfg, jit_o), kept(cfg, kept_o);
                start_lora_models({&jit, &kept}, 9, 10);
                expect_same_pass_gradients(jit, kept, cfg, B, T, 71);
            }
            expect_lora_steps_bit_identical(jit_o, kept_o, cfg);
        }
    }
}

// The transposes inside a captured CUDA graph (replayed every micro-batch) and under --recompute-block,
// and with --train-also=norms,embeddings (whose gradients reach the embedding through every layer's
// input gradient): the same bits as the kept transposes run eagerly. Untied Qwen2, tied Qwen3.
TEST(CudaLoraFp8Transpose, GraphsRecomputeAndTrainAlsoBitIdenticalToKeptTransposes) {
    QTRAIN_REQUIRE_GPU();
    for (ModelConfig (*make)() : {qwen2_case, qwen3_case}) {
        const ModelConfig cfg = make();
        const int B = 2, T = 48;
        for (bool also : {false, true}) {
            SCOPED_TRACE(cfg.model_type + (also ? " with --train-also=norms,embeddings" : ""));
            LoraOptions lora = lora_options(0.2f);
            if (also) lora.train_also = kTrainNorms | kTrainEmbeddings;
            ModelOptions jit_o = fp8_base(DType::E5M2, B, T, lora, false);
            jit_o.use_cuda_graphs = true;
            jit_o.recompute_block = true;
            const ModelOptions kept_o = fp8_base(DType::E5M2, B, T, lora, true);
            {
                CudaModel jit(cfg, jit_o), kept(cfg, kept_o);
                start_lora_models({&jit, &kept}, 9, 10);
                expect_same_pass_gradients(jit, kept, cfg, B, T, 72);
            }
            expect_lora_steps_bit_identical(jit_o, kept_o, cfg);
        }
    }
}
