// LoRA --train-also on the GPU model (issue 33; lora_layout.h, lora_adapters.h): the norms and/or the
// embeddings / LM head (tied: the one matrix) trained in full beside the adapters. Against the CPU
// model's --train-also on small random configs (Qwen2 with biases, Qwen3's q/k norms, Llama; tied and
// untied): the loss, every adapter's and trained tensor's gradient (fp32 tightly, bf16 by cosine, the
// bounds of cuda_lora_test.cpp) and three AdamW steps, after which the forward reads the trained
// values; the checkpoint and the PEFT adapter are the CPU model's files and a resume continues bit for
// bit; recompute and CUDA graphs change no bit; the FP8 base trains them too (against the CPU
// emulating it), with an FP8 LM head too, quantised again from the trained head after each update.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

constexpr uint32_t kBoth = kTrainNorms | kTrainEmbeddings;

// lora_options, lora_gpu_options / lora_cpu_options, same_start, compare_lora_grads: cuda_lora_fixture.h.

ModelConfig with_tying(ModelConfig c, bool tied) {
    c.tie_word_embeddings = tied;
    c.validate("test");
    return c;
}
ModelConfig qwen2_tied() { return with_tying(qwen2_case(), true); }
ModelConfig qwen3_untied() { return with_tying(qwen3_case(), false); }
ModelConfig llama_tied() { return with_tying(llama_case(), true); }

struct AlsoCase {
    const char* name;
    ModelConfig (*config)();
    float dropout;
    const char* targets;
    uint32_t also;
};

const AlsoCase kCases[] = {
    {"qwen2_norms", qwen2_case, 0.0f, "all", kTrainNorms},
    {"qwen2_embeddings_dropout", qwen2_case, 0.1f, "all", kTrainEmbeddings},
    {"qwen2_tied_both", qwen2_tied, 0.0f, "q,v,down", kBoth},
    {"qwen3_tied_both_dropout", qwen3_case, 0.2f, "all", kBoth},
    {"qwen3_untied_norms", qwen3_untied, 0.0f, "all", kTrainNorms},
    {"llama_both", llama_case, 0.0f, "all", kBoth},
    {"llama_tied_embeddings", llama_tied, 0.0f, "k,o,up", kTrainEmbeddings},
};

}  // namespace

class CudaLoraTrainAlsoVsCpu : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(CudaLoraTrainAlsoVsCpu, LossGradientsAndStepsMatch) {
    QTRAIN_REQUIRE_GPU();
    const auto [which, act] = GetParam();
    const AlsoCase& lc = kCases[which];
    const ModelConfig cfg = lc.config();
    const int B = 2, T = 48;
    const LoraOptions lora = lora_options(lc.dropout, lc.targets, lc.also);
    CpuModel cpu(cfg, lora_cpu_options(B, T, lora));
    CudaModel gpu(cfg, lora_gpu_options(act, B, T, lora));
    same_start(gpu, {&cpu}, 77, act != DType::F32);
    const bool fp32 = act == DType::F32;
    const std::vector<ParamSpec> trained = lora_train_also_parameters(cfg, lora);
    ASSERT_FALSE(trained.empty());
    std::vector<std::vector<float>> initial;
    for (const ParamSpec& s : trained) initial.push_back(gpu.download(s.name, CudaModel::Which::Master));

    const Tokens e = random_tokens(B, T, cfg.vocab_size, 3, Masked::Every11thFrom3);
    EXPECT_NEAR(gpu.evaluate(e.batch(B, T)), cpu.evaluate(e.batch(B, T)), (fp32 ? 1e-5 : 2e-2) * cpu.evaluate(e.batch(B, T)));

    for (int step = 1; step <= 3; ++step) {
        SCOPED_TRACE(step);
        const Tokens d = random_tokens(B, T, cfg.vocab_size, 10 + step, Masked::Every11thFrom3);
        cpu.forward_backward(d.batch(B, T), 0.5f);
        gpu.forward_backward(d.batch(B, T), 0.5f);
        // the trained tensors have a gradient (a test of two zero gradients would pass too)
        for (const ParamSpec& s : trained) {
            const float* g = cpu.grad(s.name);
            EXPECT_TRUE(std::any_of(g, g + s.numel(), [](float x) { return x != 0.0f; })) << s.name;
        }
        const LoraAgreement a = compare_lora_grads(gpu, cpu);
        std::printf("[%s %s step %d] grads: worst rel %.3g (%s), worst cosine %.6f; trained: rel %.3g, cosine %.6f\n",
                    lc.name, std::string(dtype_name(act)).c_str(), step, a.worst_rel, a.worst.c_str(), a.worst_cos,
                    a.trained_rel, a.trained_cos);
        expect_lora_step_matches_cpu(gpu, cpu, a, step, fp32);
    }
    // the forward reads the trained values: the base's weights are their masters (rounded to the model
    // dtype), and the evaluation agrees with the CPU's, whose forward reads its trained base
    for (std::size_t i = 0; i < trained.size(); ++i) {
        const std::string hf = trained[i].name.substr(std::string(kPeftPrefix).size());
        const std::vector<float> master = gpu.download(trained[i].name, CudaModel::Which::Master);
        EXPECT_EQ(gpu.download(hf, CudaModel::Which::Weights), fp32 ? master : round_bf16(master)) << hf;
        EXPECT_NE(master, initial[i]) << hf << " did not move";
        EXPECT_EQ(gpu.download(hf, CudaModel::Which::Master), master) << hf << ": by its HF name, the fp32 master";
        EXPECT_EQ(gpu.download(hf, CudaModel::Which::AdamV), gpu.download(trained[i].name, CudaModel::Which::AdamV));
    }
    const Tokens e2 = random_tokens(B, T, cfg.vocab_size, 4, Masked::Every11thFrom3);
    const float ce = cpu.evaluate(e2.batch(B, T));
    EXPECT_NEAR(gpu.evaluate(e2.batch(B, T)), ce, (fp32 ? 1e-5 : 2e-2) * ce);
    expect_frozen_base_unmoved(gpu, cpu, cfg, fp32);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaLoraTrainAlsoVsCpu,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kCases))),
                                            ::testing::Values(DType::F32, DType::BF16)),
                         [](const auto& info) {
                             return std::string(kCases[std::get<0>(info.param)].name) + "_" +
                                    (std::get<1>(info.param) == DType::F32 ? "fp32" : "bf16");
                         });

TEST(CudaLoraTrainAlso, RecomputeAndCudaGraphsAreBitIdentical) {
    QTRAIN_REQUIRE_GPU();
    for (ModelConfig (*make)() : {qwen2_case, qwen3_case}) {
        const ModelConfig cfg = make();
        const ModelOptions plain = lora_gpu_options(DType::BF16, 2, 48, lora_options(0.2f, "all", kBoth));
        ModelOptions block = plain, att = plain, graphs = plain;
        block.recompute_block = true;
        att.recompute_att = att.recompute_swiglu = att.recompute_norm = true;
        graphs.use_cuda_graphs = graphs.recompute_block = true;
        test::expect_lora_steps_bit_identical(plain, block, cfg);
        test::expect_lora_steps_bit_identical(plain, att, cfg);
        test::expect_lora_steps_bit_identical(plain, graphs, cfg);
    }
}

// The checkpoint holds the adapters, the trained tensors and their moments in the CPU model's files
// (the CPU model reads them back to the same values), a resumed model continues bit for bit (bf16 and
// fp32, dropout on), and the export is the CPU model's PEFT adapter, byte for byte (modules_to_save;
// a tied model's matrix under lm_head too).
TEST(CudaLoraTrainAlso, CheckpointIsTheCpuLayoutAndResumesBitExact) {
    QTRAIN_REQUIRE_GPU();
    for (ModelConfig (*make)() : {qwen3_case, llama_case}) {
        for (DType act : {DType::BF16, DType::F32}) {
            const ModelConfig cfg = make();
            SCOPED_TRACE(std::string(cfg.model_type) + " " + std::string(dtype_name(act)));
            const int B = 2, T = 48;
            const LoraOptions lora = lora_options(0.2f, "q,k,v,o,down", kBoth);
            const ModelOptions o = lora_gpu_options(act, B, T, lora);
            TempDir dir;
            const std::string ckpt = dir.file("ckpt");
            std::filesystem::create_directories(ckpt);
            auto steps = [&](CudaModel& m, int first, int last) {
                return lora_resume_steps(m, cfg, B, T, first, last);
            };
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
                EXPECT_EQ(resumed.download(s.name, CudaModel::Which::Master),
                          full.download(s.name, CudaModel::Which::Master))
                    << s.name;
            const std::string norm = "model.norm.weight";
            EXPECT_EQ(resumed.download(norm, CudaModel::Which::Weights), full.download(norm, CudaModel::Which::Weights));

            CpuModel cpu(cfg, lora_cpu_options(B, T, lora));
            cpu.init_random(21);
            cpu.load_checkpoint(ckpt);
            CudaModel at2(cfg, o);
            at2.init_random(21);
            at2.load_checkpoint(ckpt);
            for (const ParamSpec& s : cpu.lora().specs()) {
                EXPECT_EQ(std::vector<float>(cpu.lora().param(s.name), cpu.lora().param(s.name) + s.numel()),
                          at2.download(s.name, CudaModel::Which::Master))
                    << s.name;
                EXPECT_EQ(std::vector<float>(cpu.lora().adam_m(s.name), cpu.lora().adam_m(s.name) + s.numel()),
                          at2.download(s.name, CudaModel::Which::AdamM))
                    << s.name;
            }
            const std::string gdir = dir.file("gpu-out"), cdir = dir.file("cpu-out");
            at2.save_hf(gdir);
            cpu.save_hf(cdir);
            for (const char* f : {kAdapterConfigFile, kAdapterWeightsFile})
                EXPECT_EQ(read_file(gdir + "/" + f), read_file(cdir + "/" + f)) << f;
            // --merge-lora: the trained values replace the base's in the merged export
            ModelOptions merge = o;
            merge.lora.merge = true;
            CudaModel m(cfg, merge);
            m.init_random(21);
            m.load_checkpoint(ckpt);
            const std::string mdir = dir.file("merged");
            m.save_hf(mdir);
            EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(mdir) / "model.safetensors"));
        }
    }
}

namespace {

// The FP8 base: a bf16 model with e4m3 matmuls; the CPU emulating it (cuda_lora_fp8_test.cpp).
ModelOptions fp8_options(int B, int T, const LoraOptions& lora, bool fp8_head) {
    ModelOptions o = fp8_base_options(DType::E4M3, DType::BF16, B, T, lora);
    o.fp8_lm_head = fp8_head;
    return o;
}

// Three steps on both models (tokens of seed `seed0 + step`, scale 1), each followed by the gradients'
// comparison (no cosine below 0.95, printed as "[label step N]") and an AdamW step with `op` on both (losses
// within 0.5%); then the GPU takes the CPU's trained values for the next step, after the last step too
// unless `keep_last` (the GPU then keeps its own update, for what the test reads after).
void fp8_steps_against_cpu(CudaModel& gpu, CpuModel& cpu, const ModelConfig& cfg, int B, int T, uint64_t seed0,
                           OptimizerParams op, const char* label, bool keep_last) {
    for (int step = 1; step <= 3; ++step) {
        SCOPED_TRACE(step);
        const Tokens d = random_tokens(B, T, cfg.vocab_size, seed0 + step, Masked::Every11thFrom3);
        cpu.forward_backward(d.batch(B, T), 1.0f);
        gpu.forward_backward(d.batch(B, T), 1.0f);
        const LoraAgreement a = compare_lora_grads(gpu, cpu);
        std::printf("[%s step %d] worst cosine %.6f (%s), trained %.6f\n", label, step, a.worst_cos, a.worst.c_str(),
                    a.trained_cos);
        EXPECT_GE(a.worst_cos, 0.95);
        op.step = step;
        const StepStats sc = cpu.optimizer_step(op), sg = gpu.optimizer_step(op);
        EXPECT_NEAR(sg.loss, sc.loss, 5e-3 * sc.loss);
        if (step < 3 || !keep_last)
            for (const ParamSpec& sp : cpu.lora().specs()) gpu.upload_master(sp.name, cpu.lora().param(sp.name));
    }
}

}  // namespace

// The FP8 base trains the norms and embeddings too (they are not FP8 matrices): against the CPU
// emulating it, the loss within 0.5% and no gradient below cosine 0.95 (cuda_lora_fp8_test.cpp's
// bounds), over three steps following the CPU's values. (With an FP8 LM head: the next test.)
TEST(CudaLoraTrainAlso, Fp8BaseTrainsThem) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = llama_case();
    const int B = 2, T = 48;
    const LoraOptions lora = lora_options(0.0f, "all", kBoth);
    ModelOptions emu = lora_cpu_options(B, T, lora);
    emu.matmul_dtype = DType::E4M3;
    emu.gradient_dtype = DType::BF16;
    CpuModel cpu(cfg, emu);
    CudaModel gpu(cfg, fp8_options(B, T, lora, false));
    same_start(gpu, {&cpu}, 31, true);
    fp8_steps_against_cpu(gpu, cpu, cfg, B, T, 60, {1e-3f, 0.9f, 0.95f, 1e-2f, 0.1f, 1.0f, 1}, "fp8 base train-also",
                          false);
}

// An FP8 LM head (--lm-head-dtype=e4m3) whose matrix --train-also=embeddings trains (built in session 24; it
// was refused before): the head's e4m3 copy is quantised again from the trained values after each update
// (LoraAdapters::bind_base's after_write), and with FP8 gradients its dW runs in FP8 as the full model's.
// Against the CPU emulating the same (its FP8 head quantises the current head at every forward): losses
// within 0.5% over three updates and no gradient below cosine 0.95, for e5m2 and bf16 gradients, tied and
// untied heads (vocabularies that are multiples of 16, as the FP8 GEMMs need). A stale FP8 copy would keep
// the first step's logits: the later losses would leave the CPU's.
TEST(CudaLoraTrainAlso, Fp8HeadIsQuantisedAgainAfterEachUpdate) {
    QTRAIN_REQUIRE_GPU();
    const int B = 2, T = 48;
    const LoraOptions lora = lora_options(0.0f, "all", kTrainEmbeddings);
    for (bool tied : {false, true})
        for (DType grad : {DType::E5M2, DType::BF16}) {
            SCOPED_TRACE(std::string(tied ? "tied" : "untied") + ", " + std::string(dtype_name(grad)) + " gradients");
            const ModelConfig cfg = small_config({"v112", 112, 128, 96, 2, 2, 1, tied});
            ModelOptions emu = lora_cpu_options(B, T, lora);
            emu.matmul_dtype = DType::E4M3;
            emu.gradient_dtype = grad;
            emu.fp8_lm_head = true;
            emu.lmhead_chunks = 2;
            CpuModel cpu(cfg, emu);
            ModelOptions go = fp8_base_options(DType::E4M3, grad, B, T, lora);
            go.fp8_lm_head = true;
            CudaModel gpu(cfg, go);
            same_start(gpu, {&cpu}, 37, true);
            // (the GPU keeps its own last update: what follows reads it)
            fp8_steps_against_cpu(gpu, cpu, cfg, B, T, 90, {1e-2f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 1},
                                  "fp8 head, trained embeddings,", true);
            // What the GPU's forward reads after its own last update must be a head quantised from the
            // updated values: the same bits as a model whose head is frozen and was set to those values
            // (its own quantisation path), with the same adapters.
            ModelOptions fo = go;
            fo.lora.train_also = 0;
            CudaModel fresh(cfg, fo);
            fresh.init_random(37);  // the matrices same_start left as the seed made them
            for (const auto& p : cpu.params())  // the norms and biases same_start drew, and the trained head
                if (p.kind == ParamKind::Norm || p.kind == ParamKind::Bias) {
                    const std::vector<float> v = gpu.download(p.name, CudaModel::Which::Weights);
                    fresh.upload_master(p.name, v.data());
                }
            for (const ParamSpec& s : fresh.lora()->host().specs()) {
                const std::vector<float> v = gpu.download(s.name, CudaModel::Which::Master);
                fresh.upload_master(s.name, v.data());
            }
            std::vector<std::string> trained = {"model.embed_tokens.weight"};  // (tied: the head too)
            if (!tied) trained.push_back("lm_head.weight");
            for (const std::string& name : trained) {
                const std::vector<float> v = gpu.download(name, CudaModel::Which::Weights);
                fresh.upload_master(name, v.data());
            }
            const Tokens e = random_tokens(B, T, cfg.vocab_size, 999, Masked::Every11thFrom3);
            EXPECT_EQ(gpu.evaluate(e.batch(B, T)), fresh.evaluate(e.batch(B, T)))
                << "the trained head's FP8 copy is not the one its updated values give";
        }
}
