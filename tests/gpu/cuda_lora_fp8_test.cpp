// LoRA on an FP8 base (issue 33; --matmul-dtype=e4m3 under --lora-rank): the frozen base's GEMMs read
// e4m3 copies quantised once after the load, the adapters stay bf16 on the unquantised inputs. Against
// the CPU model emulating it (tests/model/cpu_lora_fp8_test.cpp) and the exact (fp32) CPU LoRA model,
// with the criteria of CudaModelFp8.LossAndGradientsTrackTheFp32Reference applied to the adapter
// gradients; fresh adapters give the full FP8 model's logits to the bit (so the base runs the FP8
// path); recompute and CUDA graphs change no bit; a resumed run continues bit for bit; --merge-lora
// merges into the bf16 base, not the e4m3 copies. (With FP8 gradients these runs keep no bf16 base
// matrix on the GPU, fp8_base_only: what that changes is tested in cuda_lora_fp8_base_memory_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "gpu_model_fixture.h"
#include "cuda_lora_fixture.h"
#include "model/lora.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

// lora_options, fp8_base_options, same_start, expect_fp8_merge_is_bf16_merge: cuda_lora_fixture.h.

// The GPU's FP8 base: a bf16 model with e4m3 matmuls and `grad` gradients.
ModelOptions gpu_options(DType grad, int B, int T, const LoraOptions& lora, bool fp8_head = false) {
    ModelOptions o = fp8_base_options(DType::E4M3, grad, B, T, lora);
    o.fp8_lm_head = fp8_head;
    return o;
}

// The CPU model: exact (fp32), or emulating the FP8 base (e4m3 matmuls, `grad` gradients).
ModelOptions cpu_options(int B, int T, const LoraOptions& lora, bool emulate, DType grad, bool fp8_head = false) {
    ModelOptions o = lora_cpu_options(B, T, lora);
    if (emulate) {
        o.matmul_dtype = DType::E4M3;
        o.gradient_dtype = grad;
        o.fp8_lm_head = fp8_head;
    }
    return o;
}

// Cosines of every adapter gradient of the GPU against a CPU model's: the worst and the median.
GradAgreement compare_adapter_grads(const CudaModel& gpu, CpuModel& cpu) {
    GradAgreement r;
    std::vector<double> all;
    for (const ParamSpec& s : cpu.lora().specs()) {
        std::vector<float> ref(cpu.grad(s.name), cpu.grad(s.name) + s.numel());
        const double cs = cosine(gpu.download(s.name, CudaModel::Which::Grad), ref);
        all.push_back(cs);
        if (cs < r.worst) r.worst = cs, r.worst_name = s.name;
    }
    std::sort(all.begin(), all.end());
    r.median = all[all.size() / 2];
    return r;
}

struct Fp8LoraCase {
    const char* name;
    ModelConfig (*config)();
    float dropout;
    const char* targets;
    bool fp8_head;
};

// (the FP8 head needs a vocabulary that is a multiple of 16)
ModelConfig v112_case() { return small_config({"v112", 112, 128, 96, 2, 2, 1, false}); }

const Fp8LoraCase kCases[] = {
    {"qwen2_all", qwen2_case, 0.0f, "all", false},
    {"qwen3_subset_dropout", qwen3_case, 0.2f, "q,v,down", false},
    {"llama3_all", llama_case, 0.0f, "all", false},
    {"v112_all_fp8_head_dropout", v112_case, 0.1f, "all", true},
};

}  // namespace

// The loss, every adapter gradient and three AdamW steps of the GPU's FP8 base against the CPU
// emulating it and the exact CPU model: the loss within 0.5% of the emulation and 1% of exact, the
// emulation nearer to the GPU than exact is (median and worst adapter), no adapter below 0.95 against
// the emulation; after each step the GPU and exact CPU take the emulation's adapters, so each step
// compares gradients, not drift. The frozen base does not move.
class CudaLoraFp8VsCpu : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(CudaLoraFp8VsCpu, TracksTheCpuEmulation) {
    QTRAIN_REQUIRE_GPU();
    const auto [which, grad] = GetParam();
    const Fp8LoraCase& lc = kCases[which];
    const ModelConfig cfg = lc.config();
    const int B = 2, T = 48;  // 96 rows: a multiple of 16 (and each LM-head chunk of 48)
    const LoraOptions lora = lora_options(lc.dropout, lc.targets);
    CudaModel gpu(cfg, gpu_options(grad, B, T, lora, lc.fp8_head));
    CpuModel emu(cfg, cpu_options(B, T, lora, true, grad, lc.fp8_head)), exact(cfg, cpu_options(B, T, lora, false, grad));
    same_start(gpu, {&emu, &exact}, 77, true);  // (the CPUs get the GPU's bf16-rounded base)
    const std::string q = "model.layers.0.self_attn.q_proj.weight";
    const std::vector<float> q0 = gpu.download(q, CudaModel::Which::Weights);

    const Tokens e = random_tokens(B, T, cfg.vocab_size, 3, Masked::Every11thFrom3);
    const float gpu_eval = gpu.evaluate(e.batch(B, T)), emu_eval = emu.evaluate(e.batch(B, T));
    EXPECT_NEAR(gpu_eval, emu_eval, 0.005 * emu_eval) << "eval loss";

    for (int step = 1; step <= 3; ++step) {
        SCOPED_TRACE(step);
        const Tokens d = random_tokens(B, T, cfg.vocab_size, 10 + step, Masked::Every11thFrom3);
        gpu.forward_backward(d.batch(B, T), 0.5f);
        emu.forward_backward(d.batch(B, T), 0.5f);
        exact.forward_backward(d.batch(B, T), 0.5f);
        const GradAgreement vse = compare_adapter_grads(gpu, emu), vs32 = compare_adapter_grads(gpu, exact);
        const OptimizerParams op{1e-3f, 0.9f, 0.95f, 1e-2f, 0.1f, 1.0f, step};
        const StepStats sg = gpu.optimizer_step(op), se = emu.optimizer_step(op), s32 = exact.optimizer_step(op);
        std::printf("[lora fp8 base %s grads %s step %d] loss %.5f vs emulation %.5f, exact %.5f; adapter-gradient "
                    "cosine vs emulation: worst %.5f (%s), median %.5f; vs exact: worst %.5f (%s), median %.5f\n",
                    lc.name, std::string(dtype_name(grad)).c_str(), step, sg.loss, se.loss, s32.loss, vse.worst,
                    vse.worst_name.c_str(), vse.median, vs32.worst, vs32.worst_name.c_str(), vs32.median);
        EXPECT_NEAR(sg.loss, se.loss, 0.005 * se.loss);
        EXPECT_NEAR(sg.loss, s32.loss, 0.01 * s32.loss);
        EXPECT_GE(vse.worst, 0.95) << vse.worst_name;
        EXPECT_GE(vse.median, vs32.median);
        EXPECT_GE(vse.worst, vs32.worst);
        for (const ParamSpec& s : emu.lora().specs()) {  // follow the emulation's adapters
            const float* v = emu.lora().param(s.name);
            gpu.upload_master(s.name, v);
            std::copy(v, v + s.numel(), exact.lora().param(s.name));
        }
    }
    EXPECT_EQ(gpu.download(q, CudaModel::Which::Weights), q0) << "the frozen base moved";
    EXPECT_ERROR(gpu.download(q, CudaModel::Which::Grad), "frozen under LoRA");
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaLoraFp8VsCpu,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kCases))),
                                            ::testing::Values(DType::BF16, DType::E4M3, DType::E5M2)),
                         [](const auto& info) {
                             return std::string(kCases[std::get<0>(info.param)].name) + "_grads_" +
                                    std::string(dtype_name(std::get<1>(info.param)));
                         });

// Fresh adapters (B = 0) add nothing: the FP8 base's logits and loss are the full FP8 model's to the
// bit, so its GEMMs read the same e4m3 copies with the same activation scales; and they differ from
// the bf16 base's (the e4m3 copies are what the GEMMs read, not the bf16 weights).
TEST(CudaLoraFp8, FreshAdaptersGiveTheFullFp8ModelsLogits) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen3_case();
    const int B = 2, T = 48;
    const LoraOptions lora = lora_options(0.0f, "all");
    for (DType grad : {DType::BF16, DType::E5M2}) {
        SCOPED_TRACE(dtype_name(grad));
        CudaModel fp8(cfg, gpu_options(grad, B, T, lora)), full(cfg, gpu_options(grad, B, T, LoraOptions{}));
        ModelOptions bo = gpu_options(grad, B, T, lora);
        bo.matmul_dtype = bo.gradient_dtype = DType::BF16;
        CudaModel bf16(cfg, bo);
        for (CudaModel* m : {&fp8, &full, &bf16}) m->init_random(12);
        const CpuModel names(cfg, CpuModel::fp32_options(B, T));
        for (const auto& p : names.params())  // the LoRA models' base in the full model
            full.upload_master(p.name, fp8.download(p.name, CudaModel::Which::Weights).data());
        const Tokens d = random_tokens(B, T, cfg.vocab_size, 4, Masked::Every11thFrom3);
        EXPECT_EQ(fp8.logits(d.batch(B, T)), full.logits(d.batch(B, T)));
        EXPECT_EQ(fp8.evaluate(d.batch(B, T)), full.evaluate(d.batch(B, T)));
        EXPECT_NE(fp8.logits(d.batch(B, T)), bf16.logits(d.batch(B, T)));
    }
}

TEST(CudaLoraFp8, RecomputeAndCudaGraphsAreBitIdentical) {
    QTRAIN_REQUIRE_GPU();
    for (DType grad : {DType::BF16, DType::E5M2}) {
        SCOPED_TRACE(dtype_name(grad));
        const ModelConfig cfg = qwen2_case();
        const ModelOptions eager = gpu_options(grad, 2, 48, lora_options(0.2f, "all"));
        ModelOptions graphs = eager, block = eager;
        graphs.use_cuda_graphs = true;
        block.recompute_block = true;
        test::expect_lora_steps_bit_identical(eager, graphs, cfg);
        test::expect_lora_steps_bit_identical(eager, block, cfg);
        graphs.recompute_block = true;  // and with the recompute inside the graph
        test::expect_lora_steps_bit_identical(eager, graphs, cfg);
    }
}

// A checkpoint of an FP8-base run (the adapters, their moments and the pass count: the base is
// --model's, quantised again on load) resumes bit for bit, FP8 gradients and dropout on.
TEST(CudaLoraFp8, CheckpointResumesBitExact) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen3_case();
    const int B = 2, T = 48;
    const ModelOptions o = gpu_options(DType::E5M2, B, T, lora_options(0.2f, "q,k,v,o,down"));
    TempDir dir;
    const std::string ckpt = dir.file("ckpt");
    std::filesystem::create_directories(ckpt);
    auto steps = [&](CudaModel& m, int first, int last) { return lora_resume_steps(m, cfg, B, T, first, last); };
    CudaModel full(cfg, o);
    full.init_random(21);
    steps(full, 1, 2);
    full.save_checkpoint(ckpt);
    const std::vector<float> rest = steps(full, 3, 5);
    CudaModel resumed(cfg, o);
    resumed.init_random(21);  // the base, as the engine loads it from --model before the checkpoint
    resumed.load_checkpoint(ckpt);
    EXPECT_EQ(steps(resumed, 3, 5), rest);
    for (const ParamSpec& s : full.lora()->host().specs())
        for (auto w : {CudaModel::Which::Master, CudaModel::Which::AdamV})
            EXPECT_EQ(resumed.download(s.name, w), full.download(s.name, w)) << s.name;
}

// --merge-lora of an FP8-base run merges into the bf16 base (from --model), not the e4m3 copies: the
// same bytes as the bf16 base's run holding the same adapters.
TEST(CudaLoraFp8, MergedExportIsTheBf16BasePlusTheAdapters) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen2_case();
    LoraOptions lora = lora_options(0.0f, "all");
    lora.merge = true;
    ModelOptions fo = gpu_options(DType::E5M2, 2, 48, lora), bo = fo;
    bo.matmul_dtype = bo.gradient_dtype = DType::BF16;
    CudaModel fp8(cfg, fo), bf16(cfg, bo);
    fp8.init_random(6);
    bf16.init_random(6);
    expect_fp8_merge_is_bf16_merge(fp8, bf16, cfg);
}
