// --param-grad-dtype=bf16 on the device (without --offload-gradients): the plan keeps the flat gradient
// in bf16 plus the staging it needs (two fp32 layer slots, the fp32 non-layer gradients), and what the
// flag used to refuse now plans. No GPU needed (the GPU tests of the training are in cuda_model_test.cpp,
// CudaModel.Bf16DeviceGradientsAreTheOffloadedOnesOnTheDevice, and cuda_graphs_offload_test.cpp).
#include <gtest/gtest.h>

#include <string>

#include "model/cuda/cuda_model.h"
#include "model/cuda/gpu_buffers.h"
#include "model/cuda/gpu_layout.h"
#include "model/memory_plan.h"
#include "model/model_config.h"
#include "model/model_options.h"

using namespace qtrain;

namespace {

uint64_t category(const MemoryPlan& p, const std::string& name) {
    uint64_t b = 0;
    for (const auto& e : p.entries)
        if (e.category == name) b += e.device_bytes;
    return b;
}

ModelOptions bf16_options(int B, int T) {
    ModelOptions o;
    o.batch_size = B;
    o.seq_len = T;
    o.model_dtype = o.matmul_dtype = o.gradient_dtype = DType::BF16;
    return o;
}

}  // namespace

TEST(Bf16DeviceGradientsPlan, FlatGradientHalvesAndTheStagingIsPlanned) {
    for (const char* name : {"Qwen2.5-7B", "Qwen2.5-14B", "Llama-3.1-8B"}) {
        SCOPED_TRACE(name);
        const ModelConfig cfg = preset_config(name);
        const GpuParamLayout layout = make_gpu_layout(cfg);
        ModelOptions o = bf16_options(4, 1024);
        const MemoryPlan fp32 = gpu_memory_plan(cfg, o, "cuda");
        o.param_grad_dtype = DType::BF16;
        EXPECT_TRUE(gradients_staged(o));
        const MemoryPlan bf16 = gpu_memory_plan(cfg, o, "cuda");
        EXPECT_NO_THROW(CudaModel::plan(cfg, o));  // refused before session 24 (it needed --offload-gradients)
        const double P = static_cast<double>(layout.total);
        // the flat copy: 4 -> 2 bytes a parameter (padding to the arenas' alignment aside)
        EXPECT_NEAR(static_cast<double>(category(fp32, "Gradients") - category(bf16, "Gradients")), 2 * P, 0.01 * P);
        // the staging: two layer slots and the non-layer gradients, fp32
        const double non_layer = P - static_cast<double>(layout.layers_end() - layout.layer_begin(0));
        const double staging = 4.0 * (2.0 * layout.layer_span + non_layer);
        EXPECT_NEAR(static_cast<double>(bf16.total_device()) - static_cast<double>(fp32.total_device()),
                    staging - 2 * P, 0.01 * P);
        EXPECT_LT(bf16.total_device(), fp32.total_device() - static_cast<uint64_t>(P));  // at these sizes: > 1 B a parameter saved
        EXPECT_EQ(bf16.total_pinned(), fp32.total_pinned());
    }
}

TEST(Bf16DeviceGradientsPlan, OnlyTheFullModelStages) {
    ModelOptions o = bf16_options(2, 64);
    EXPECT_FALSE(gradients_staged(o));  // fp32 on the device: the flat buffer, no slots
    o.offload_gradients = true;
    EXPECT_TRUE(gradients_staged(o));
    o.offload_gradients = false;
    o.param_grad_dtype = DType::BF16;
    EXPECT_TRUE(gradients_staged(o));
    o.lora.rank = 8;  // a frozen base has no gradient buffer
    EXPECT_FALSE(gradients_staged(o));
    // and LoRA refuses the flag by name rather than ignore it (its adapters' gradient is fp32)
    try {
        CudaModel::plan(preset_config("Qwen2.5-0.5B"), o);
        FAIL() << "LoRA with bf16 gradients planned";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("--param-grad-dtype=bf16"), std::string::npos) << e.what();
    }
}

// With several ranks bf16 gradients stay ZeRO-2's (a rank's block, reduced per layer): ZeRO-1 would
// all-reduce the bf16 sums.
TEST(Bf16DeviceGradientsPlan, SeveralRanksStillNeedZeroTwo) {
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    ModelOptions o = bf16_options(2, 64);
    o.param_grad_dtype = DType::BF16;
    o.gpus = 2;
    try {
        CudaModel::plan(cfg, o);
        FAIL() << "ZeRO-1 with bf16 gradients planned";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("--param-grad-dtype=bf16"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("ZeRO-2"), std::string::npos) << e.what();
    }
    o.shard_gradients = true;
    EXPECT_NO_THROW(CudaModel::plan(cfg, o));
}

// What a staged gradient slot zeroes (GpuParamLayout::layer_non_matrix_elements) and what the matrices'
// weight-gradient GEMMs write must cover every layer element once: norms, biases, Qwen3's q/k norms and
// the padding after tensors whose size is not a multiple of the layout's alignment (the small test shapes
// have some), nothing of a matrix.
TEST(Bf16DeviceGradientsPlan, SlotZeroingAndTheGemmsCoverTheLayerOnce) {
    const ModelConfig shapes[] = {preset_config("Qwen2.5-0.5B"), preset_config("Qwen3-0.6B"), preset_config("Llama-3.2-1B")};
    ModelConfig odd = preset_config("Qwen2.5-0.5B");  // sizes off the 64-element alignment: padding everywhere
    odd.hidden_size = 72, odd.num_attention_heads = 3, odd.num_key_value_heads = 1, odd.head_dim = 24;
    odd.intermediate_size = 100, odd.num_hidden_layers = 2, odd.vocab_size = 97;
    const ModelConfig all[] = {shapes[0], shapes[1], shapes[2], odd};
    for (int c = 0; c < 4; ++c) {
        const ModelConfig& cfg = all[c];
        const GpuParamLayout layout = make_gpu_layout(cfg);
        std::vector<int> covered(static_cast<std::size_t>(layout.layer_span), 0);
        for (GpuParamLayout::Range r : layout.layer_non_matrix_elements())
            for (int64_t i = r.begin; i < r.end; ++i) ++covered[i];
        int64_t padding = 0, small = 0;
        for (std::size_t i = 0; i < layout.specs.size(); ++i) {
            if (layout.specs[i].layer != 0) continue;
            const int64_t b = layout.offsets[i] - layout.layer_begin(0), n = layout.specs[i].numel();
            if (layout.specs[i].kind == ParamKind::Matrix)
                for (int64_t j = b; j < b + n; ++j) ++covered[j];
            else
                small += n;
            const int64_t end = i + 1 < layout.specs.size() ? layout.offsets[i + 1] - layout.layer_begin(0) : layout.layer_span;
            padding += std::min(end, layout.layer_span) - (b + n);
        }
        for (int64_t i = 0; i < layout.layer_span; ++i) ASSERT_EQ(covered[i], 1) << cfg.architecture << " element " << i;
        int64_t zeroed = 0;
        for (GpuParamLayout::Range r : layout.layer_non_matrix_elements()) zeroed += r.end - r.begin;
        EXPECT_EQ(zeroed, small + padding);
        if (c == 3) EXPECT_GT(padding, 0) << "the odd shape was meant to have padding";
    }
}
