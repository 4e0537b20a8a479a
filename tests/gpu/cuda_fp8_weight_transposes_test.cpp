// --fp8-weight-transposes=jit (issue 32; ModelOptions::fp8_transposes_jit, fp8_transposes_just_in_time in
// gpu_buffers.h): the full model with FP8 gradients keeps only the row-major e4m3 copy of each layer
// matrix, and the backward transposes each one into one scratch buffer right before its input-gradient
// GEMM (transpose_fp8, as LoRA's FP8 base does). A transpose moves the e4m3 bytes as they are, and the
// row-major codes are quantize_fp8's, which are quantize_fp8_transpose's row-major output bit for bit,
// so against the default (kept) layout: the transposed codes the GEMM reads, the losses, gradient
// norms, evaluations, gradients, master weights, weights and Adam moments of several AdamW steps are
// the same bits, for each family, e4m3 and e5m2 gradients, with recompute, CUDA graphs, the FP8 LM
// head and streamed weights (--shard-weights, --persistent-quants, --offload-quants); and the device
// memory measured falls by what the plans say. (ZeRO-3 drops the same slots' copies; its gathers are
// exercised by the data-parallel tests with the default layout only.)
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_model_fixture.h"
#include "measured_device_bytes.h"
#include "model/cuda/gpu_buffers.h"
#include "model/cuda/gpu_layout.h"
#include "model/cuda/layer_matrices.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

ModelOptions fp8_options(DType grad, int B, int T, bool jit) {
    ModelOptions o = CpuModel::fp32_options(B, T);
    o.model_dtype = DType::BF16;
    o.matmul_dtype = DType::E4M3;
    o.gradient_dtype = grad;
    o.lmhead_chunks = 2;
    o.fp8_transposes_jit = jit;
    return o;
}

const FamilyCase kFamilies[] = {{"qwen2", qwen2_case}, {"qwen3", qwen3_case}, {"llama", llama_case}};

// The family's case with a vocabulary of 144 (the FP8 LM head's GEMMs need a multiple of 16; not of the
// transpose's 64-wide tiles, so the head's partial tiles are exercised too).
ModelConfig family(const FamilyCase& f) {
    ModelConfig c = f.make();
    c.vocab_size = 144;
    c.validate("test");
    return c;
}

// Three steps of two micro-batches (one with every target masked), an evaluation after each, the
// gradients read mid-step, then every tensor's master, weights, gradient and Adam moments.
std::vector<float> train_steps(const ModelConfig& cfg, const ModelOptions& o) {
    const int B = o.batch_size, T = o.seq_len;
    CudaModel m(cfg, o);
    m.init_random(5);
    std::vector<float> out;
    for (int step = 1; step <= 3; ++step) {
        for (int micro = 0; micro < 2; ++micro) {
            Tokens d = random_tokens(B, T, cfg.vocab_size, 300 * step + micro, Masked::Every11thFrom3);
            if (step == 2 && micro == 1) std::fill(d.tgt.begin(), d.tgt.end(), -1);
            m.forward_backward(d.batch(B, T), 0.5f);
        }
        if (step == 3)
            for (const ParamSpec& s : m.layout().specs) {
                auto g = m.download(s.name, CudaModel::Which::Grad);
                out.insert(out.end(), g.begin(), g.end());
            }
        const StepStats s = m.optimizer_step({2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step});
        out.push_back(s.loss);
        out.push_back(s.grad_norm);
        Tokens e = random_tokens(B, T, cfg.vocab_size, 7, Masked::Every11thFrom3);
        out.push_back(m.evaluate(e.batch(B, T)));
    }
    for (const ParamSpec& s : m.layout().specs)
        for (auto which : {CudaModel::Which::Master, CudaModel::Which::Weights, CudaModel::Which::Grad,
                           CudaModel::Which::AdamM, CudaModel::Which::AdamV}) {
            auto w = m.download(s.name, which);
            out.insert(out.end(), w.begin(), w.end());
        }
    return out;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    std::size_t first_diff = got.size();
    for (std::size_t i = 0; i < got.size() && first_diff == got.size(); ++i)
        if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) first_diff = i;
    EXPECT_EQ(first_diff, got.size()) << "first difference at value " << first_diff << " of " << got.size();
}

}  // namespace

TEST(CudaFp8WeightTransposes, OptionsSelectTheLayout) {
    EXPECT_TRUE(fp8_transposes_just_in_time(fp8_options(DType::E5M2, 2, 48, true)));
    EXPECT_TRUE(fp8_transposes_just_in_time(fp8_options(DType::E4M3, 2, 48, true)));
    EXPECT_FALSE(fp8_transposes_just_in_time(fp8_options(DType::E5M2, 2, 48, false)));
    // (bf16 gradients keep no transposed e4m3 copies: the model refuses jit there, check_options)
    EXPECT_FALSE(fp8_transposes_just_in_time(fp8_options(DType::BF16, 2, 48, true)));
    EXPECT_FALSE(fp8_base_transposes_in_backward(fp8_options(DType::E5M2, 2, 48, true)));  // (LoRA's own)
}

// What the input-gradient GEMM reads: the transpose made in the scratch equals the kept copy, and the
// row-major codes are the same, after the initial quantisation and after AdamW's re-quantisation.
TEST(CudaFp8WeightTransposes, ScratchHoldsTheKeptTransposedCodes) {
    QTRAIN_REQUIRE_GPU();
    for (const FamilyCase& f : kFamilies) {
        SCOPED_TRACE(f.name);
        const ModelConfig cfg = family(f);
        const int B = 2, T = 48;
        CudaModel jit(cfg, fp8_options(DType::E5M2, B, T, true)), kept(cfg, fp8_options(DType::E5M2, B, T, false));
        jit.init_random(11);
        kept.init_random(11);
        for (int step = 1; step <= 2; ++step) {
            SCOPED_TRACE(step == 1 ? "initial quantisation" : "after an AdamW step");
            for (int l = 0; l < cfg.num_hidden_layers; ++l)
                for (Matrix m : {kQkv, kO, kGateUp, kDown}) {
                    EXPECT_EQ(jit.download_fp8_matrix(l, m, false), kept.download_fp8_matrix(l, m, false))
                        << "layer " << l << " matrix " << static_cast<int>(m);
                    EXPECT_EQ(jit.download_fp8_matrix(l, m, true), kept.download_fp8_matrix(l, m, true))
                        << "layer " << l << " matrix " << static_cast<int>(m);
                    EXPECT_EQ(jit.fp8_matrix_scale(l, m), kept.fp8_matrix_scale(l, m));
                }
            Tokens d = random_tokens(B, T, cfg.vocab_size, 40 + step, Masked::None);
            for (CudaModel* m : {&jit, &kept}) {
                m->forward_backward(d.batch(B, T), 1.0f);
                m->optimizer_step({2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step});
            }
        }
    }
}

// Training: jit against kept, bit for bit, over the variants the flag combines with.
TEST(CudaFp8WeightTransposes, TrainingIsBitIdenticalToKeptTransposes) {
    QTRAIN_REQUIRE_GPU();
    struct Variant {
        const char* name;
        void (*apply)(ModelOptions&);
    };
    const Variant variants[] = {
        {"resident", [](ModelOptions&) {}},
        {"recompute-block", [](ModelOptions& o) { o.recompute_block = true; }},
        {"recompute-ffn + recompute-norm", [](ModelOptions& o) {
             o.recompute_ffn = o.recompute_swiglu = o.recompute_norm = true;
         }},
        {"cuda graphs", [](ModelOptions& o) { o.use_cuda_graphs = true; }},
        {"cuda graphs + recompute-block", [](ModelOptions& o) { o.use_cuda_graphs = o.recompute_block = true; }},
        {"fp8 LM head", [](ModelOptions& o) { o.fp8_lm_head = true; }},
        {"shard-weights (streamed)", [](ModelOptions& o) { o.shard_weights = true; }},
        {"shard-weights + persistent-quants + cuda graphs", [](ModelOptions& o) {
             o.shard_weights = o.persistent_quants = o.use_cuda_graphs = true;
         }},
        {"shard-weights + offload-quants + recompute-block + offloaded gradients + fp8 LM head",
         [](ModelOptions& o) {
             o.shard_weights = o.offload_quants = o.recompute_block = o.fp8_lm_head = true;
             o.offload_gradients = o.shard_gradients = true;
         }},
    };
    for (const FamilyCase& f : kFamilies) {
        const ModelConfig cfg = family(f);
        for (DType grad : {DType::E4M3, DType::E5M2})
            for (const Variant& v : variants) {
                SCOPED_TRACE(std::string(f.name) + ", " + std::string(dtype_name(grad)) + ", " + v.name);
                ModelOptions kept = fp8_options(grad, 2, 64, false);
                v.apply(kept);
                ModelOptions jit = kept;
                jit.fp8_transposes_jit = true;
                ASSERT_TRUE(fp8_transposes_just_in_time(jit));
                expect_same_bits(train_steps(cfg, jit), train_steps(cfg, kept));
            }
    }
}

// Measured: jit takes less device memory than kept by what the plans say (within 16 MiB: cudaMalloc's
// 2 MiB granularity over the arenas), and that is the flat transposed copy (one byte per parameter)
// less the scratch (the largest layer matrix). A mid-sized config (8 layers of 15.7M matrix elements:
// ~126 MB of e4m3 transposes), resident; and streamed, where only the two slots' copies go.
TEST(CudaFp8WeightTransposes, MeasuredDeviceMemoryFallsByThePlannedAmount) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = small_config({"mid", 1024, 1024, 4096, 8, 8, 4, false});
    const int B = 2, T = 64;
    const int64_t slack = int64_t{16} << 20;
    const GpuParamLayout ly = make_gpu_layout(cfg);
    const int64_t scratch = 2 * int64_t{4096} * 1024;  // gate|up, the largest
    for (bool streamed : {false, true}) {
        SCOPED_TRACE(streamed ? "streamed" : "resident");
        ModelOptions kept = fp8_options(DType::E5M2, B, T, false);
        kept.shard_weights = streamed;
        ModelOptions jit = kept;
        jit.fp8_transposes_jit = true;
        for (const ModelOptions* o : {&kept, &jit}) measured_device_bytes(cfg, *o);  // one-off allocations first
        const int64_t m_kept = measured_device_bytes(cfg, kept), m_jit = measured_device_bytes(cfg, jit);
        auto planned = [&](const ModelOptions& o) {
            return static_cast<int64_t>(gpu_memory_plan(cfg, o, "cuda").total_device());
        };
        const int64_t plan_saving = planned(kept) - planned(jit);
        std::printf("[fp8 weight transposes, %s] measured: kept %lld, jit %lld bytes; planned %lld, %lld\n",
                    streamed ? "streamed" : "resident", static_cast<long long>(m_kept),
                    static_cast<long long>(m_jit), static_cast<long long>(planned(kept)),
                    static_cast<long long>(planned(jit)));
        EXPECT_NEAR(static_cast<double>(m_kept - m_jit), static_cast<double>(plan_saving), static_cast<double>(slack));
        const int64_t dropped = streamed ? 2 * ((ly.layer_span + 255) / 256 * 256) : (ly.total + 255) / 256 * 256;
        EXPECT_EQ(plan_saving, dropped - scratch);
        if (!streamed) EXPECT_GT(plan_saving, 6 * slack);  // (the difference stands out of the slack)
    }
}
