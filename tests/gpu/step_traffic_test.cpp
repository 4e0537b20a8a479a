// The memory-bound ops' traffic floor (src/model/cuda/step_traffic.h) against the counts the perf notes
// made by hand (session 21: SwiGLU ~300 KB a token and layer at 7B; the 7B optimizer ~167 GB a step with
// fp32 master and gradients, bf16 moments), and what the flags move between device and PCIe.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "model/cuda/step_traffic.h"
#include "model/model_config.h"
#include "model/model_options.h"

using namespace qtrain;

namespace {

ModelOptions bf16(int B, int T) {
    ModelOptions o;
    o.batch_size = B;
    o.seq_len = T;
    o.model_dtype = o.matmul_dtype = o.gradient_dtype = DType::BF16;
    o.opt_m_dtype = o.opt_v_dtype = DType::BF16;
    return o;
}

std::map<std::string, StepTraffic> by_name(const std::vector<StepTraffic>& v) {
    std::map<std::string, StepTraffic> m;
    for (const StepTraffic& t : v) m[t.name] = t;
    return m;
}

}  // namespace

TEST(StepTraffic, MatchesTheHandCountsOfThePerfNotes) {
    const ModelConfig c = preset_config("Qwen2.5-7B");
    const ModelOptions o = bf16(4, 1024);
    const auto m = by_name(step_traffic(c, o));
    const double N = 4 * 1024, L = c.num_hidden_layers, I = c.intermediate_size;
    EXPECT_DOUBLE_EQ(m.at("swiglu").device_bytes, N * L * 16 * I);  // 303 KB a token and layer
    EXPECT_NEAR(m.at("swiglu").device_bytes / (N * L), 300e3, 5e3);
    // llm.q's command: fp32 master and gradients on the device, bf16 moments and weights: 22 B a parameter
    const StepTraffic& opt = m.at("optimizer");
    EXPECT_TRUE(opt.per_step);
    EXPECT_DOUBLE_EQ(opt.device_bytes, 22.0 * c.num_parameters());
    EXPECT_NEAR(opt.device_bytes, 167e9, 3e9);
    EXPECT_EQ(opt.host_bytes, 0.0);
    EXPECT_FALSE(m.count("fp8 quantize"));  // no FP8
    EXPECT_TRUE(m.count("bias grad"));      // Qwen2's q|k|v bias
    EXPECT_DOUBLE_EQ(m.at("cross entropy").device_bytes, N * 2 * c.vocab_size * 2);
}

TEST(StepTraffic, OffloadMovesTheOptimizerStateOverPcie) {
    const ModelConfig c = preset_config("Qwen2.5-14B");
    ModelOptions o = bf16(8, 1024);
    o.offload_master = o.offload_opt_m = o.offload_opt_v = true;  // llm.q's 14B command
    const double P = static_cast<double>(c.num_parameters());
    StepTraffic opt = by_name(step_traffic(c, o)).at("optimizer");
    EXPECT_DOUBLE_EQ(opt.host_bytes, P * (8 + 4 + 4));   // master r/w, m and v r/w in bf16
    EXPECT_DOUBLE_EQ(opt.device_bytes, P * (4 + 2));      // the fp32 gradient read, the bf16 weights written
    EXPECT_NEAR(opt.host_bytes, 237e9, 5e9);              // session 23's 237 GB
    o.offload_master = false;
    o.master_dtype = DType::BF16;  // the weights are the master: only the moments cross PCIe
    opt = by_name(step_traffic(c, o)).at("optimizer");
    EXPECT_DOUBLE_EQ(opt.host_bytes, P * 8);
    EXPECT_NEAR(opt.host_bytes, 118e9, 3e9);              // session 23's ~118 GB
}

// Staged gradients flush each layer's fp32 slot into the kept copy once per micro-batch: on the device for
// bf16 gradients (4 + 2 + 2 bytes a layer parameter), over PCIe for the offloaded copy; none for the flat
// fp32 buffer (its dW GEMMs accumulate in place).
TEST(StepTraffic, StagedGradientsFlushEachMicroBatch) {
    const ModelConfig c = preset_config("Qwen2.5-7B");
    ModelOptions o = bf16(4, 1024);
    EXPECT_FALSE(by_name(step_traffic(c, o)).count("gradient flush"));
    const double layer_params = 28.0 * (3584.0 * 4608 + 4608 + 3584.0 * 3584 + 3 * 3584.0 * 18944 + 2 * 3584);
    o.param_grad_dtype = DType::BF16;
    StepTraffic f = by_name(step_traffic(c, o)).at("gradient flush");
    EXPECT_NEAR(f.device_bytes, 8 * layer_params, 0.001 * layer_params);  // (the layout's padding aside)
    EXPECT_EQ(f.host_bytes, 0.0);
    o.offload_gradients = true;
    f = by_name(step_traffic(c, o)).at("gradient flush");
    EXPECT_NEAR(f.device_bytes, 4 * layer_params, 0.001 * layer_params);
    EXPECT_NEAR(f.host_bytes, 4 * layer_params, 0.001 * layer_params);
}

TEST(StepTraffic, Fp8AddsTheQuantisationAndLoraDropsWhatItHasNot) {
    const ModelConfig c = preset_config("Qwen2.5-7B");
    ModelOptions o = bf16(12, 2048);
    o.matmul_dtype = DType::E4M3;
    o.gradient_dtype = DType::E5M2;
    const auto full = by_name(step_traffic(c, o));
    ASSERT_TRUE(full.count("fp8 quantize"));
    ModelOptions lo = o;
    lo.lora.rank = 16;
    const auto lora = by_name(step_traffic(c, lo));
    EXPECT_LT(lora.at("fp8 quantize").device_bytes, full.at("fp8 quantize").device_bytes);  // no transposed copies
    EXPECT_FALSE(lora.count("optimizer"));
    EXPECT_FALSE(lora.count("bias grad"));
    // LoRA's FP8 base, per token and layer: inputs (2h + q + I) read and coded, the O amax pass (cuDNN),
    // dy of q|k|v, o, down read and coded: session 23's ~124 KB; and d(gate|up): its bf16 values, which the
    // SwiGLU backward wrote with their amax, read and coded (a pass of its own: session 27)
    const double h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), I = c.intermediate_size;
    const double per = (2 * h + q + I) * 3 + (q + 2 * kv + 2 * h) * 3 + 2 * I * 3;
    const double n = 12.0 * 2048 * c.num_hidden_layers;
    EXPECT_GE(lora.at("fp8 quantize").device_bytes, per * n);            // (+ the O amax pass when on cuDNN)
    EXPECT_LE(lora.at("fp8 quantize").device_bytes, (per + q * 2) * n + 1);
    // the full model's second SwiGLU pass recomputes d(gate|up) from d_swi and gate|up (3I read) and writes
    // its codes both ways (4I); the inputs and dy are also written transposed (4 bytes an element)
    const double full_per = (2 * h + q + I) * 4 + (q + 2 * kv + 2 * h) * 4 + 3 * I * 2 + 2 * I * 2;
    EXPECT_GE(full.at("fp8 quantize").device_bytes, full_per * n);
    EXPECT_LE(full.at("fp8 quantize").device_bytes, (full_per + q * 2) * n + 1);
}
