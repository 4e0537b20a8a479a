// LoRA on the GPU model (issue 33, lora_adapters.h) against the CPU reference model's LoRA on small
// random configs: the same frozen base and adapters (A from the seed, B non-zero), the same batch;
// loss and every adapter gradient agree (fp32 tightly, bf16 by cosine), with and without dropout
// (the same masks), over several AdamW steps; the forward equals the base with the adapters merged
// in; recompute and CUDA graphs change no bit; the checkpoint and the PEFT adapter are the CPU
// model's files, and a resumed model continues bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "gpu_model_fixture.h"
#include "cuda_lora_fixture.h"
#include "model/lora.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

// The families (qwen2_case, qwen3_case, llama_case) and random_tokens: gpu_model_fixture.h; lora_options,
// lora_gpu_options / lora_cpu_options, same_start and compare_lora_grads: cuda_lora_fixture.h.

struct LoraCase {
    const char* name;
    ModelConfig (*config)();
    float dropout;
    const char* targets;
};

const LoraCase kCases[] = {
    {"qwen2_all", qwen2_case, 0.0f, "all"},
    {"qwen2_all_dropout", qwen2_case, 0.25f, "all"},
    {"qwen2_subset_dropout", qwen2_case, 0.1f, "k,o,up"},
    {"qwen3_subset", qwen3_case, 0.0f, "q,v,down"},
    {"qwen3_all_dropout", qwen3_case, 0.2f, "all"},
    {"llama3_all", llama_case, 0.0f, "all"},
    {"llama3_gate_down_dropout", llama_case, 0.3f, "gate,down"},
};

}  // namespace

// The loss, every adapter gradient and three AdamW steps against the CPU model's LoRA.
class CudaLoraVsCpu : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(CudaLoraVsCpu, LossAdapterGradientsAndStepsMatch) {
    QTRAIN_REQUIRE_GPU();
    const auto [which, act] = GetParam();
    const LoraCase& lc = kCases[which];
    const ModelConfig cfg = lc.config();
    const int B = 2, T = 48;
    const LoraOptions lora = lora_options(lc.dropout, lc.targets);
    CpuModel cpu(cfg, lora_cpu_options(B, T, lora));
    CudaModel gpu(cfg, lora_gpu_options(act, B, T, lora));
    same_start(gpu, {&cpu}, 77, act != DType::F32);
    const bool fp32 = act == DType::F32;

    const Tokens e = random_tokens(B, T, cfg.vocab_size, 3, Masked::Every11thFrom3);
    const float cpu_eval = cpu.evaluate(e.batch(B, T)), gpu_eval = gpu.evaluate(e.batch(B, T));
    EXPECT_NEAR(gpu_eval, cpu_eval, (fp32 ? 1e-5 : 2e-2) * cpu_eval) << "eval loss (no dropout in evaluation)";

    expect_lora_steps_match_cpu(gpu, cpu, cfg, B, T, fp32, std::string(lc.name) + " " + std::string(dtype_name(act)));
    expect_frozen_base_unmoved(gpu, cpu, cfg, fp32);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaLoraVsCpu,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kCases))),
                                            ::testing::Values(DType::F32, DType::BF16)),
                         [](const auto& info) {
                             return std::string(kCases[std::get<0>(info.param)].name) + "_" +
                                    (std::get<1>(info.param) == DType::F32 ? "fp32" : "bf16");
                         });

// The forward with adapters is the base with W + s B A (PEFT's merge_and_unload): the logits of the
// LoRA model against those of a model without LoRA holding the merged weights (fp32).
TEST(CudaLora, LogitsEqualTheMergedBase) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen2_case();
    const int B = 2, T = 40;
    const LoraOptions lora = lora_options(0.25f, "all");  // (no dropout outside training)
    CpuModel cpu(cfg, lora_cpu_options(B, T, lora));
    CudaModel gpu(cfg, lora_gpu_options(DType::F32, B, T, lora));
    same_start(gpu, {&cpu}, 5, false);
    CudaModel merged(cfg, lora_gpu_options(DType::F32, B, T, LoraOptions{}));
    for (const auto& p : cpu.params()) {
        std::vector<float> w(cpu.param(p.name), cpu.param(p.name) + p.numel());
        for (int t = 0; t < kLoraTargets && p.layer >= 0; ++t)
            if (p.name == "model.layers." + std::to_string(p.layer) + "." +
                              lora_module_path(static_cast<LoraTarget>(t)) + ".weight")
                cpu.lora().merge_one(p.layer, static_cast<LoraTarget>(t), w.data());
        merged.upload_master(p.name, w.data());
    }
    const Tokens d = random_tokens(B, T, cfg.vocab_size, 8, Masked::Every11thFrom3);
    const std::vector<float> a = gpu.logits(d.batch(B, T)), b = merged.logits(d.batch(B, T));
    EXPECT_LT(rel_max_error(a, b), 1e-4);
}

TEST(CudaLora, RecomputeIsBitIdentical) {
    QTRAIN_REQUIRE_GPU();
    for (ModelConfig (*make)() : {qwen2_case, qwen3_case}) {
        const ModelConfig cfg = make();
        const ModelOptions plain = lora_gpu_options(DType::BF16, 2, 48, lora_options(0.2f, "all"));
        ModelOptions block = plain, att = plain;
        block.recompute_block = true;
        att.recompute_att = att.recompute_swiglu = att.recompute_norm = true;
        test::expect_lora_steps_bit_identical(plain, block, cfg);
        test::expect_lora_steps_bit_identical(plain, att, cfg);
    }
}

TEST(CudaLora, CudaGraphsAreBitIdenticalToEager) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen2_case();
    const ModelOptions eager = lora_gpu_options(DType::BF16, 2, 48, lora_options(0.2f, "all"));
    ModelOptions graphs = eager;
    graphs.use_cuda_graphs = true;
    test::expect_lora_steps_bit_identical(eager, graphs, cfg);
    graphs.recompute_block = true;  // and with the recompute inside the graph
    test::expect_lora_steps_bit_identical(eager, graphs, cfg);
}

// The checkpoint holds the adapters and their moments in the CPU model's files (the CPU model reads
// it back to the same values), and a model resumed from it continues bit for bit (dropout included:
// the pass count is in it). The export is PEFT's adapter, the CPU model's writer's bytes.
TEST(CudaLora, CheckpointIsTheCpuLayoutAndResumesBitExact) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen3_case();
    const int B = 2, T = 48;
    const LoraOptions lora = lora_options(0.2f, "q,k,v,o,down");
    const ModelOptions o = lora_gpu_options(DType::BF16, B, T, lora);
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
        EXPECT_EQ(resumed.download(s.name, CudaModel::Which::Master), full.download(s.name, CudaModel::Which::Master))
            << s.name;

    // the CPU model reads the GPU's checkpoint: the same adapters, moments and pass count
    CpuModel cpu(cfg, lora_cpu_options(B, T, lora));
    cpu.init_random(21);
    cpu.load_checkpoint(ckpt);
    CudaModel at2(cfg, o);
    at2.init_random(21);
    at2.load_checkpoint(ckpt);
    EXPECT_EQ(cpu.lora().passes(), 2u);
    for (const ParamSpec& s : cpu.lora().specs()) {
        EXPECT_EQ(std::vector<float>(cpu.lora().param(s.name), cpu.lora().param(s.name) + s.numel()),
                  at2.download(s.name, CudaModel::Which::Master)) << s.name;
        EXPECT_EQ(std::vector<float>(cpu.lora().adam_v(s.name), cpu.lora().adam_v(s.name) + s.numel()),
                  at2.download(s.name, CudaModel::Which::AdamV)) << s.name;
    }

    // the PEFT adapter: the CPU model's writer, so the CPU model holding the same adapters writes the same bytes
    const std::string gdir = dir.file("gpu-out"), cdir = dir.file("cpu-out");
    at2.save_hf(gdir);
    cpu.save_hf(cdir);
    for (const char* f : {kAdapterConfigFile, kAdapterWeightsFile})
        EXPECT_EQ(read_file(gdir + "/" + f), read_file(cdir + "/" + f)) << f;
    EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(gdir) / "model.safetensors"));
}

// A rank larger than a target's dimensions is refused naming the flag and the target, before any memory
// is taken. (What stays refused with the streamed or ZeRO-3 base: cuda_lora_fp8_stream_test.cpp's
// RefusalsNameTheirFlags; --train-also with the bf16 base streamed on one GPU now trains:
// Bf16BaseTrainsAlsoBitIdenticalToResidentBase.)
TEST(CudaLora, RefusesARankLargerThanATarget) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen2_case();
    ModelOptions big = lora_gpu_options(DType::BF16, 2, 48, lora_options(0.0f, "all"));
    big.lora.rank = 100;  // q_proj [128, 128] takes it, k_proj [64, 128] does not
    EXPECT_ERROR((void)CudaModel(cfg, big), "--lora-rank=100", "k_proj");
}

// zero_gradients (the Python Trainer's compute_gradients): the adapters' gradients of a pass are
// there to read (A's non-zero: B is), then cleared with the step loss, so the next step equals a
// model's that never made that pass. The full model refuses it, naming --device.
TEST(CudaLora, ZeroGradientsLeavesTheNextStepAsIfNoPassWasMade) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen2_case();
    const int B = 2, T = 48;
    const ModelOptions opts = lora_gpu_options(DType::BF16, B, T, lora_options(0.0f, "all"));
    CudaModel probed(cfg, opts), plain(cfg, opts);
    start_lora_models({&probed, &plain}, 9, 5);
    const Tokens probe = random_tokens(B, T, cfg.vocab_size, 77, Masked::Every11thFrom3);
    probed.forward_backward(probe.batch(B, T), 1.0f);
    for (const ParamSpec& s : probed.lora()->host().specs()) {
        const std::vector<float> g = probed.download(s.name, CudaModel::Which::Grad);
        EXPECT_TRUE(std::any_of(g.begin(), g.end(), [](float x) { return x != 0.0f; })) << s.name;
    }
    probed.zero_gradients();
    for (const ParamSpec& s : probed.lora()->host().specs()) {
        const std::vector<float> g = probed.download(s.name, CudaModel::Which::Grad);
        EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float x) { return x == 0.0f; })) << s.name;
    }
    for (int step = 1; step <= 2; ++step) {
        const Tokens d = random_tokens(B, T, cfg.vocab_size, 100 + step, Masked::Every11thFrom3);
        probed.forward_backward(d.batch(B, T), 1.0f);
        plain.forward_backward(d.batch(B, T), 1.0f);
        const OptimizerParams op{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step};
        const StepStats a = probed.optimizer_step(op), b = plain.optimizer_step(op);
        EXPECT_EQ(a.loss, b.loss) << "step " << step;
        EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
    }
    for (const ParamSpec& s : probed.lora()->host().specs())
        EXPECT_EQ(probed.download(s.name, CudaModel::Which::Master), plain.download(s.name, CudaModel::Which::Master))
            << s.name;
    ModelOptions full = CpuModel::fp32_options(B, T);
    full.model_dtype = full.matmul_dtype = full.gradient_dtype = DType::BF16;
    CudaModel whole(cfg, full);
    EXPECT_ERROR(whole.zero_gradients(), "computing gradients without a step is not supported", "--device=");
}
