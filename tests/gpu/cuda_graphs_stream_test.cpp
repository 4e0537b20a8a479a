// --use-cuda-graphs with --shard-weights on one GPU (issue 32): which layers a pass copies into the
// two device slots is decided on the host from what the slots hold (and, with --persistent-quants,
// which layers' FP8 copies are kept), so the model captures one graph per state a pass starts from
// (weights.h: StreamState) and a replay leaves the state its capture left. The same run with and
// without graphs must agree bit for bit: losses, gradient norms, the accumulated gradient after each
// step's micro-batches, evaluations, and the final masters and moments (full model) or adapters
// (LoRA's streamed base). The schedule reaches every starting state and replays each: empty slots
// (after an update), layers 0 and 1 (after a backward), the last two layers (after an evaluation or a
// fully masked micro-batch, both eager forwards between replays). Also the plan-time refusal that
// remains (ZeRO-3).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda_lora_fixture.h"
#include "gpu_model_fixture.h"
#include "model/lora.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

// A bf16 model streamed from host memory: `matmul` e4m3 or bf16, `grad` the gradient dtype; two
// LM-head chunks.
ModelOptions stream_options(DType matmul, DType grad, int B, int T) {
    ModelOptions o = fp8_base_options(matmul, grad, B, T, LoraOptions{});  // (LoRA off: rank 0)
    o.shard_weights = true;
    return o;
}

// The LoRA runs' adapters: dropout 0.2 (masks drawn per pass, from the device's pass count)
LoraOptions stream_lora_options() {
    LoraOptions l = lora_options(0.2f);
    l.seed = 4243;
    return l;
}

void append(std::vector<float>& out, const std::vector<float>& v) { out.insert(out.end(), v.begin(), v.end()); }

// Four optimizer steps of two micro-batches (targets partly masked). Step 2's first and step 3's
// second micro-batch have none (eager forwards); evaluations after steps 1 and 3. Full model, the
// passes start from: step 1 empty slots (capture), then layers 0/1 (capture); step 2 the last two
// layers (capture, after the evaluation and the masked forward); step 3 empty (replay); step 4 empty
// and layers 0/1 (replays). LoRA's frozen base keeps its slots over updates, so its passes start
// mostly from layers 0/1 or the last two.
std::vector<float> train(const ModelConfig& cfg, const ModelOptions& o) {
    const int B = o.batch_size, T = o.seq_len;
    CudaModel m(cfg, o);
    if (m.lora()) start_lora_models({&m}, 31, 5);  // non-zero B, the same on both runs
    else m.init_random(31);
    const std::vector<ParamSpec> trained = m.lora() ? m.lora()->host().specs() : m.layout().specs;
    std::vector<float> out;
    for (int step = 1; step <= 4; ++step) {
        for (int micro = 0; micro < 2; ++micro) {
            Tokens d = random_tokens(B, T, cfg.vocab_size, 900 * step + 17 * micro, Masked::Every11thFrom3);
            if ((step == 2 && micro == 0) || (step == 3 && micro == 1)) std::fill(d.tgt.begin(), d.tgt.end(), -1);
            m.forward_backward(d.batch(B, T), 0.625f);
        }
        for (const ParamSpec& s : trained) append(out, m.download(s.name, CudaModel::Which::Grad));
        const StepStats st = m.optimizer_step({2e-3f, 0.88f, 0.96f, 1e-7f, 0.03f, 0.9f, step});
        EXPECT_GT(st.grad_norm, 0.0f) << "step " << step << ": a zero gradient would compare nothing";
        out.push_back(st.loss);
        out.push_back(st.grad_norm);
        if (step % 2 == 1) {
            const Tokens e = random_tokens(B, T, cfg.vocab_size, 5150 + step, Masked::Every11thFrom3);
            out.push_back(m.evaluate(e.batch(B, T)));
        }
    }
    for (const ParamSpec& s : trained)
        for (auto w : {CudaModel::Which::Master, CudaModel::Which::AdamM, CudaModel::Which::AdamV})
            append(out, m.download(s.name, w));
    return out;
}

void expect_graphs_bit_identical(const ModelConfig& cfg, ModelOptions o) {
    o.use_cuda_graphs = false;
    const std::vector<float> eager = train(cfg, o);
    o.use_cuda_graphs = true;
    const std::vector<float> graphs = train(cfg, o);
    ASSERT_EQ(graphs.size(), eager.size());
    const std::size_t first_diff = first_bit_difference(graphs, eager);
    EXPECT_EQ(first_diff, graphs.size()) << "first difference at value " << first_diff;
}

struct Combo {
    const char* name;
    ModelOptions (*make)(int B, int T);
};

const Combo kFullModel[] = {
    {"bf16", [](int B, int T) { return stream_options(DType::BF16, DType::BF16, B, T); }},
    {"bf16 + offload-residual + offload-gradients + recompute-block + offloaded optimizer",
     [](int B, int T) {
         ModelOptions o = stream_options(DType::BF16, DType::BF16, B, T);
         o.offload_residual = o.offload_gradients = o.recompute_block = true;
         o.offload_master = o.offload_opt_m = o.offload_opt_v = true;
         return o;
     }},
    {"e4m3 matmuls, bf16 gradients (quantised on arrival, no transposes)",
     [](int B, int T) { return stream_options(DType::E4M3, DType::BF16, B, T); }},
    {"e4m3, e5m2 gradients", [](int B, int T) { return stream_options(DType::E4M3, DType::E5M2, B, T); }},
    {"e4m3, e4m3 gradients, persistent quants on the device",
     [](int B, int T) {
         ModelOptions o = stream_options(DType::E4M3, DType::E4M3, B, T);
         o.persistent_quants = true;
         return o;
     }},
    {"e4m3, e5m2 gradients, persistent quants in pinned memory (offload-quants) + offload-gradients",
     [](int B, int T) {
         ModelOptions o = stream_options(DType::E4M3, DType::E5M2, B, T);
         o.persistent_quants = o.offload_quants = o.offload_gradients = true;
         return o;
     }},
};

// LoRA's base streamed: the FP8 base's codes (FP8 gradients) or the bf16 base (bf16 gradients).
const Combo kLora[] = {
    {"LoRA, streamed FP8 base, e5m2 gradients",
     [](int B, int T) {
         ModelOptions o = stream_options(DType::E4M3, DType::E5M2, B, T);
         o.lora = stream_lora_options();
         return o;
     }},
    {"LoRA, streamed FP8 base, e4m3 gradients, recompute-block",
     [](int B, int T) {
         ModelOptions o = stream_options(DType::E4M3, DType::E4M3, B, T);
         o.lora = stream_lora_options();
         o.recompute_block = true;
         return o;
     }},
    {"LoRA, streamed bf16 base", [](int B, int T) {
         ModelOptions o = stream_options(DType::BF16, DType::BF16, B, T);
         o.lora = stream_lora_options();
         return o;
     }},
    {"LoRA, streamed bf16 base, e4m3 matmuls (quantised on arrival)", [](int B, int T) {
         ModelOptions o = stream_options(DType::E4M3, DType::BF16, B, T);
         o.lora = stream_lora_options();
         return o;
     }},
};

// Untied with 4 layers (copies in every pass), tied with 2 (a pass from layers 0/1 copies nothing:
// the copy stream joins the capture only through its fork at the start).
const ModelShape kShapes[] = {{"untied, 4 layers", 97, 128, 96, 4, 2, 1, false},
                              {"tied, 2 layers", 97, 256, 160, 2, 4, 2, true}};

TEST(CudaGraphsStream, FullModelBitIdenticalToTheRunWithoutGraphs) {
    QTRAIN_REQUIRE_GPU();
    for (const ModelShape& shape : kShapes)
        for (const Combo& c : kFullModel) {
            SCOPED_TRACE(std::string(c.name) + ", " + shape.name);
            expect_graphs_bit_identical(small_config(shape), c.make(2, 64));
        }
}

TEST(CudaGraphsStream, LoraStreamedBaseBitIdenticalToTheRunWithoutGraphs) {
    QTRAIN_REQUIRE_GPU();
    for (const ModelShape& shape : kShapes)
        for (const Combo& c : kLora) {
            SCOPED_TRACE(std::string(c.name) + ", " + shape.name);
            expect_graphs_bit_identical(small_config(shape), c.make(2, 48));
        }
}

// The plan accepts graphs with every streamed combination above, at 7B too, and refuses them with
// ZeRO-3 (the layer gathers are NCCL collectives on the copy stream) by naming the flags and the
// reason. No GPU needed.
TEST(CudaGraphsStream, PlanAcceptsStreamingOnOneGpuAndRefusesZero3) {
    const ModelShape tiny{"tiny", 97, 128, 96, 4, 2, 1, false};
    for (const Combo& c : kFullModel) {
        ModelOptions o = c.make(2, 64);
        o.use_cuda_graphs = true;
        EXPECT_NO_THROW(CudaModel::plan(small_config(tiny), o)) << c.name;
    }
    for (const Combo& c : kLora) {
        ModelOptions o = c.make(2, 48);
        o.use_cuda_graphs = true;
        EXPECT_NO_THROW(CudaModel::plan(small_config(tiny), o)) << c.name;
    }
    const ModelConfig cfg = preset_config("Qwen2.5-7B");
    ModelOptions big = stream_options(DType::E4M3, DType::E5M2, 4, 1024);
    big.use_cuda_graphs = big.recompute_block = big.offload_residual = big.offload_gradients = true;
    EXPECT_NO_THROW(CudaModel::plan(cfg, big));
    ModelOptions zero3 = stream_options(DType::BF16, DType::BF16, 4, 1024);
    zero3.use_cuda_graphs = true;
    zero3.gpus = 2;
    zero3.shard_gradients = true;
    EXPECT_ERROR(CudaModel::plan(cfg, zero3), "--use-cuda-graphs", "--shard-weights", "--gpus=1", "ZeRO-3");
}

}  // namespace
