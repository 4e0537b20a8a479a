// The FP8 LM head (--lm-head-dtype=e4m3, ModelOptions::fp8_lm_head) on the GPU model: against the CPU
// model emulating it (tests/model/cpu_fp8_lm_head_test.cpp) and the fp32 CPU model, tied and untied
// heads, one and two LM-head chunks, with and without FP8 gradients; determinism, CUDA graphs,
// recompute and streamed weights bit for bit; the off path unchanged. (Data parallel: the FP8-head
// modes of data_parallel_test.cpp.) The shapes have vocabularies that are multiples of 16, as the
// FP8 GEMMs need (cuda_model_test.cpp's shapes do not).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_model_fixture.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

const ModelShape kHeadShapes[] = {
    {"v112_h128_untied", 112, 128, 96, 2, 2, 1, false},
    {"v144_h256_tied", 144, 256, 160, 2, 4, 2, true},
};

// The GPU's FP8 options: bf16 model, e4m3 matmuls, `grad` gradients, the FP8 head, `chunks` LM-head
// chunks; qtrain's flash attention, as CudaModelFp8 calibrates against.
ModelOptions fp8_head_options(int B, int T, DType grad, int chunks) {
    ModelOptions o = CpuModel::fp32_options(B, T);
    o.model_dtype = DType::BF16;
    o.matmul_dtype = DType::E4M3;
    o.gradient_dtype = grad;
    o.fp8_lm_head = true;
    o.lmhead_chunks = chunks;
    o.attention = AttentionImpl::Flash;
    return o;
}

}  // namespace

// The GPU with the FP8 head against the CPU model emulating it (the same per-tensor scales, each LM-head
// chunk's d(logits) with its own) and against fp32, on the bf16 weights the GPU starts from. The
// criteria of CudaModelFp8.LossAndGradientsTrackTheFp32Reference (written before a GPU run of this
// test): the loss within 1% of fp32 and 0.5% of the emulation, the emulation nearer to the GPU than
// fp32 is (median and worst tensor, and the head's own gradient), no tensor below 0.95 (layout or scale
// bugs give cosines near 0). Also: the head is really FP8 (the loss differs from the same GPU model
// with a bf16 head).
TEST(CudaFp8LmHead, TracksTheCpuEmulation) {
    QTRAIN_REQUIRE_GPU();
    const int B = 2, T = 64;  // 128 rows: chunks of 128 and 64, multiples of 16
    for (const ModelShape& s : kHeadShapes) {
        for (DType grad : {DType::BF16, DType::E4M3, DType::E5M2}) {
            for (int chunks : {1, 2}) {
                const std::string what = std::string(s.name) + " grads " + std::string(dtype_name(grad)) +
                                         " chunks " + std::to_string(chunks);
                SCOPED_TRACE(what);
                const ModelConfig cfg = small_config(s);
                CudaModel gpu(cfg, fp8_head_options(B, T, grad, chunks));
                gpu.init_random(99);
                ModelOptions bf16_head = fp8_head_options(B, T, grad, chunks);
                bf16_head.fp8_lm_head = false;
                CudaModel plain(cfg, bf16_head);
                plain.init_random(99);
                const Tokens d = random_tokens(B, T, cfg.vocab_size, 8, Masked::Every11thFrom3);
                const Batch batch{d.in.data(), d.tgt.data(), B, T};
                auto cpu_run = [&](CpuModel& cpu) {
                    cpu.init_random(99);
                    copy_gpu_weights(gpu, cpu);
                    cpu.forward_backward(batch, 1.0f);
                };
                ModelOptions eo = CpuModel::fp32_options(B, T);
                eo.matmul_dtype = DType::E4M3;
                eo.gradient_dtype = grad;
                eo.fp8_lm_head = true;
                eo.lmhead_chunks = chunks;
                ModelOptions fo = CpuModel::fp32_options(B, T);
                fo.lmhead_chunks = chunks;
                CpuModel fp32(cfg, fo), emu(cfg, eo);
                cpu_run(fp32);
                cpu_run(emu);
                const float gpu_eval = gpu.evaluate(batch), plain_eval = plain.evaluate(batch);
                gpu.forward_backward(batch, 1.0f);
                const GradAgreement vs32 = compare_gradients(gpu, fp32), vse = compare_gradients(gpu, emu);
                const OptimizerParams op{0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.0f, 1};  // lr 0: the loss and norm
                const float gpu_loss = gpu.optimizer_step(op).loss, loss32 = fp32.optimizer_step(op).loss,
                            loss_e = emu.optimizer_step(op).loss;
                std::printf("[fp8 head %s] loss %.5f (eval %.5f, bf16 head %.5f) vs fp32 %.5f, emulation %.5f; "
                            "cosine vs fp32: worst %.5f (%s), median %.5f, head %.5f; vs emulation: worst %.5f (%s), "
                            "median %.5f, head %.5f\n",
                            what.c_str(), gpu_loss, gpu_eval, plain_eval, loss32, loss_e, vs32.worst,
                            vs32.worst_name.c_str(), vs32.median, vs32.head, vse.worst, vse.worst_name.c_str(),
                            vse.median, vse.head);
                EXPECT_NE(gpu_eval, plain_eval) << "the FP8 head changed nothing";
                EXPECT_NEAR(gpu_eval, gpu_loss, 1e-3 * gpu_loss) << "evaluation and training forward";
                EXPECT_NEAR(gpu_loss, loss32, 0.01 * loss32);
                EXPECT_NEAR(gpu_loss, loss_e, 0.005 * loss_e);
                EXPECT_GE(vse.worst, 0.95) << vse.worst_name;
                EXPECT_GE(vse.median, vs32.median);
                EXPECT_GE(vse.worst, vs32.worst);
                EXPECT_GE(vse.head, vs32.head);
            }
        }
    }
}

// Two runs give the same bits; CUDA graphs give the eager run's bits (a captured step has no host
// sync and fixed pointers), also with recompute and a micro-batch whose targets are all masked; the
// head is not recomputed, so --recompute-block changes no bit either. Losses, norms, eval losses and
// every master weight after 6 steps of 2 micro-batches.
TEST(CudaFp8LmHead, DeterministicAndCudaGraphsAreBitIdentical) {
    QTRAIN_REQUIRE_GPU();
    const int B = 2, T = 64;
    struct Case {
        const char* name;
        int shape;
        DType grad;
        int chunks;
    };
    for (const Case& c : {Case{"tied, e5m2 gradients, 2 chunks", 1, DType::E5M2, 2},
                          Case{"untied, bf16 gradients, 1 chunk", 0, DType::BF16, 1},
                          Case{"untied, e4m3 gradients, 2 chunks", 0, DType::E4M3, 2}}) {
        SCOPED_TRACE(c.name);
        const ModelConfig cfg = small_config(kHeadShapes[c.shape]);
        auto run = [&](bool graphs, bool recompute) {
            ModelOptions o = fp8_head_options(B, T, c.grad, c.chunks);
            o.use_cuda_graphs = graphs;
            o.recompute_block = recompute;
            CudaModel m(cfg, o);
            m.init_random(5);
            std::vector<float> out;
            for (int step = 1; step <= 6; ++step) {
                for (int micro = 0; micro < 2; ++micro) {
                    Tokens d = random_tokens(B, T, cfg.vocab_size, 500 * step + micro, Masked::Every11thFrom3);
                    if (step == 3 && micro == 1) std::fill(d.tgt.begin(), d.tgt.end(), -1);
                    m.forward_backward(Batch{d.in.data(), d.tgt.data(), B, T}, 0.5f);
                }
                const StepStats s = m.optimizer_step({2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step});
                out.push_back(s.loss);
                out.push_back(s.grad_norm);
                if (step % 3 == 0) {
                    const Tokens e = random_tokens(B, T, cfg.vocab_size, 77, Masked::Every11thFrom3);
                    out.push_back(m.evaluate(Batch{e.in.data(), e.tgt.data(), B, T}));
                }
            }
            for (const ParamSpec& s : m.layout().specs) {
                auto w = m.download(s.name, CudaModel::Which::Master);
                out.insert(out.end(), w.begin(), w.end());
            }
            return out;
        };
        const auto eager = run(false, false);
        EXPECT_EQ(run(false, false), eager) << "two eager runs differ";
        EXPECT_EQ(run(true, false), eager) << "CUDA graphs";
        EXPECT_EQ(run(true, true), eager) << "CUDA graphs + --recompute-block";
    }
}

// Streamed weights (--shard-weights on one GPU: the head resident, its FP8 copies in their own
// buffers, quantised after changed() refreshed it) give the resident run's bits, as streaming does
// for the layers (Dtypes/Streaming in cuda_model_test.cpp); with persistent quants and with the
// gradients streamed too. Tied (the copy is of the embedding) and untied.
TEST(CudaFp8LmHead, StreamedWeightsAreBitIdenticalToResident) {
    QTRAIN_REQUIRE_GPU();
    const int B = 2, T = 64;
    for (const ModelShape& s : kHeadShapes) {
        const ModelConfig cfg = small_config(s);
        for (DType grad : {DType::BF16, DType::E5M2}) {
            auto run = [&](void (*apply)(ModelOptions&)) {
                ModelOptions o = fp8_head_options(B, T, grad, 2);
                apply(o);
                CudaModel m(cfg, o);
                m.init_random(3);
                std::vector<float> out;
                for (int step = 1; step <= 4; ++step) {
                    for (int micro = 0; micro < 2; ++micro) {
                        const Tokens d =
                            random_tokens(B, T, cfg.vocab_size, 100 * step + micro, Masked::Every11thFrom3);
                        m.forward_backward(Batch{d.in.data(), d.tgt.data(), B, T}, 0.5f);
                    }
                    const StepStats st = m.optimizer_step({2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step});
                    out.push_back(st.loss);
                    out.push_back(st.grad_norm);
                    const Tokens e = random_tokens(B, T, cfg.vocab_size, 7, Masked::Every11thFrom3);
                    out.push_back(m.evaluate(Batch{e.in.data(), e.tgt.data(), B, T}));
                }
                for (const ParamSpec& p : m.layout().specs)
                    for (auto which : {CudaModel::Which::Master, CudaModel::Which::Weights}) {
                        auto w = m.download(p.name, which);
                        out.insert(out.end(), w.begin(), w.end());
                    }
                return out;
            };
            const auto resident = run([](ModelOptions&) {});
            struct Variant {
                const char* name;
                void (*apply)(ModelOptions&);
                bool fp8_grads_only;
            };
            const Variant variants[] = {
                {"shard-weights", [](ModelOptions& o) { o.shard_weights = true; }, false},
                {"shard-weights + offload-gradients + recompute-block",
                 [](ModelOptions& o) { o.shard_weights = o.offload_gradients = o.shard_gradients = o.recompute_block = true; },
                 false},
                {"shard-weights + persistent-quants", [](ModelOptions& o) { o.shard_weights = o.persistent_quants = true; },
                 true},
            };
            for (const Variant& v : variants) {
                if (v.fp8_grads_only && !is_fp8(grad)) continue;  // (refused with bf16 gradients)
                SCOPED_TRACE(std::string(s.name) + " grads " + std::string(dtype_name(grad)) + ": " + v.name);
                const auto got = run(v.apply);
                ASSERT_EQ(got.size(), resident.size());
                std::size_t first_diff = got.size();
                for (std::size_t i = 0; i < got.size() && first_diff == got.size(); ++i)
                    if (std::memcmp(&got[i], &resident[i], sizeof(float)) != 0) first_diff = i;
                EXPECT_EQ(first_diff, got.size()) << "first difference at value " << first_diff;
            }
        }
    }
}

// What the FP8 head cannot do is refused naming the flags: without FP8 matmuls, LM-head chunks whose
// rows are not a multiple of 16, a vocabulary that is not one (the FP8 GEMMs' alignment).
TEST(CudaFp8LmHead, RefusalsNameTheFlags) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig good = small_config(kHeadShapes[0]);
    ModelOptions o = fp8_head_options(2, 64, DType::E5M2, 1);
    o.matmul_dtype = DType::BF16;
    o.gradient_dtype = DType::BF16;
    EXPECT_ERROR(CudaModel(good, o), "--lm-head-dtype=e4m3 needs --matmul-dtype=e4m3");
    // chunks of 40 rows: not a multiple of 16
    ModelOptions odd = fp8_head_options(2, 40, DType::E5M2, 2);
    EXPECT_ERROR(CudaModel(good, odd), "--lm-head-dtype=e4m3", "--lmhead-chunks=2");
    // a vocabulary that is not a multiple of 16 (cuda_model_test.cpp's 97)
    ModelShape s = kHeadShapes[0];
    s.vocab = 97;
    EXPECT_ERROR(CudaModel(small_config(s), fp8_head_options(2, 64, DType::E5M2, 1)), "--lm-head-dtype=e4m3",
                 "vocab_size");
}
