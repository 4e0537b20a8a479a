// --lora-overlap-sms (LoraAdapters::begin_forward / begin_backward): the adapters' GEMMs that do not read the
// base's output run on a second stream beside the base GEMM, which plans for fewer SMs. The arithmetic is the
// adapters' own, so the run must agree with the CPU reference as the one-stream run does, and CUDA graphs
// (which capture the fork and join) must replay it bit for bit. (Against the one-stream run it need not be
// bit-identical: the base GEMMs may pick other algorithms for fewer SMs.)
#include <string>

#include <gtest/gtest.h>

#include "cuda_lora_fixture.h"
#include "gpu_model_fixture.h"
#include "gpu_test_util.h"

namespace qtrain::test {
namespace {

constexpr int kSideSms = 16;

ModelOptions with_overlap(ModelOptions o) {
    o.lora_overlap_sms = kSideSms;
    return o;
}

// fp32 (tight) and bf16 bases on every target and on a subset with single-target matrices, three steps
// against the CPU model's LoRA: gradients, losses and masters within cuda_lora_test.cpp's bounds.
TEST(CudaLoraOverlap, MatchesTheCpuReference) {
    QTRAIN_REQUIRE_GPU();
    for (const char* targets : {"all", "q,v,down"})
        for (DType act : {DType::F32, DType::BF16}) {
            SCOPED_TRACE(std::string(targets) + " " + std::string(dtype_name(act)));
            const ModelConfig cfg = qwen2_case();
            const int B = 2, T = 48;
            const LoraOptions lora = lora_options(0.0f, targets);
            CpuModel cpu(cfg, lora_cpu_options(B, T, lora));
            CudaModel gpu(cfg, with_overlap(lora_gpu_options(act, B, T, lora)));
            ASSERT_TRUE(gpu.lora()->overlapping());
            same_start(gpu, {&cpu}, 77, act != DType::F32);
            expect_lora_steps_match_cpu(gpu, cpu, cfg, B, T, act == DType::F32,
                                        std::string("overlap ") + targets + " " + std::string(dtype_name(act)));
        }
}

// Eager against CUDA graphs, both overlapping (and with the recompute inside the graph), on the bf16
// base and on the FP8 base.
TEST(CudaLoraOverlap, CudaGraphsAreBitIdenticalToEager) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen2_case();
    const LoraOptions lora = lora_options(0.0f, "all");
    for (const ModelOptions& base :
         {lora_gpu_options(DType::BF16, 2, 48, lora), fp8_base_options(DType::E4M3, DType::E5M2, 2, 48, lora)}) {
        const ModelOptions eager = with_overlap(base);
        ModelOptions graphs = eager;
        graphs.use_cuda_graphs = true;
        expect_lora_steps_bit_identical(eager, graphs, cfg);
        graphs.recompute_block = true;
        expect_lora_steps_bit_identical(eager, graphs, cfg);
    }
}

// What the overlap needs is said by name: LoRA without dropout (each target's mask is one scratch), and
// fewer SMs than the device has.
TEST(CudaLoraOverlap, RefusesDropoutAndTooManySms) {
    QTRAIN_REQUIRE_GPU();
    const ModelConfig cfg = qwen2_case();
    auto message = [&](const ModelOptions& o) {
        try {
            CudaModel m(cfg, o);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    const std::string dropout = message(with_overlap(lora_gpu_options(DType::BF16, 2, 48, lora_options(0.1f, "all"))));
    EXPECT_NE(dropout.find("--lora-overlap-sms"), std::string::npos) << dropout;
    EXPECT_NE(dropout.find("--lora-dropout"), std::string::npos) << dropout;
    ModelOptions all = lora_gpu_options(DType::BF16, 2, 48, lora_options(0.0f, "all"));
    all.lora_overlap_sms = 100000;
    const std::string sms = message(all);
    EXPECT_NE(sms.find("SMs"), std::string::npos) << sms;
}

}  // namespace
}  // namespace qtrain::test
