// --use-cuda-graphs with --offload-residual and --offload-gradients (issue 32): the roles' side-stream
// copies are captured as branches of the step's graph, and the one per-micro-batch choice (the
// offloaded gradient's copy-or-add) is read on the device. The same run with and without graphs must
// agree bit for bit: losses, gradient norms, the accumulated gradient after each step's micro-batches
// (read from the host copy the captured flushes wrote), an evaluation between steps (an eager forward
// between replays, whose residual copies the next replay must not race) and the final master weights
// and Adam moments. Also the plan-time refusals that remain.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpu_model_fixture.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

// bf16 everything, or (fp8) e4m3 matmuls with e5m2 gradients; two LM-head chunks.
ModelOptions graph_options(bool fp8, int B, int T) {
    ModelOptions o = CpuModel::fp32_options(B, T);
    o.model_dtype = o.matmul_dtype = o.gradient_dtype = DType::BF16;
    if (fp8) {
        o.matmul_dtype = DType::E4M3;
        o.gradient_dtype = DType::E5M2;
    }
    o.lmhead_chunks = 2;
    return o;
}

// Four optimizer steps of two micro-batches (targets partly masked; step 3's second micro-batch has
// none, so it runs eagerly between replays), an evaluation after steps 2 and 4.
std::vector<float> train(const ModelConfig& cfg, const ModelOptions& o) {
    const int B = o.batch_size, T = o.seq_len;
    CudaModel m(cfg, o);
    m.init_random(23);
    std::vector<float> out;
    for (int step = 1; step <= 4; ++step) {
        for (int micro = 0; micro < 2; ++micro) {
            Tokens d = random_tokens(B, T, cfg.vocab_size, 700 * step + 31 * micro, Masked::Every11thFrom3);
            if (step == 3 && micro == 1) std::fill(d.tgt.begin(), d.tgt.end(), -1);
            m.forward_backward(d.batch(B, T), 0.75f);
        }
        for (const ParamSpec& s : m.layout().specs) {  // the step's accumulated gradient, before the update
            auto g = m.download(s.name, CudaModel::Which::Grad);
            out.insert(out.end(), g.begin(), g.end());
        }
        const StepStats st = m.optimizer_step({3e-3f, 0.85f, 0.97f, 1e-7f, 0.05f, 0.8f, step});
        out.push_back(st.loss);
        out.push_back(st.grad_norm);
        if (step % 2 == 0) {
            const Tokens e = random_tokens(B, T, cfg.vocab_size, 4242 + step, Masked::Every11thFrom3);
            out.push_back(m.evaluate(e.batch(B, T)));
        }
    }
    for (const ParamSpec& s : m.layout().specs)
        for (auto w : {CudaModel::Which::Master, CudaModel::Which::AdamM, CudaModel::Which::AdamV}) {
            auto v = m.download(s.name, w);
            out.insert(out.end(), v.begin(), v.end());
        }
    return out;
}

struct Combo {
    const char* name;
    void (*apply)(ModelOptions&);
};

const Combo kCombos[] = {
    {"offload-residual + recompute-block", [](ModelOptions& o) { o.offload_residual = o.recompute_block = true; }},
    {"offload-residual (no recompute)", [](ModelOptions& o) { o.offload_residual = true; }},
    {"offload-gradients", [](ModelOptions& o) { o.offload_gradients = true; }},
    {"offload-gradients + shard-gradients + bf16 host gradients",
     [](ModelOptions& o) {
         o.offload_gradients = o.shard_gradients = true;
         o.param_grad_dtype = DType::BF16;
     }},
    {"bf16 gradients on the device (staged like the offloaded ones)",
     [](ModelOptions& o) { o.param_grad_dtype = DType::BF16; }},
    {"offload-residual + offload-gradients + recompute-block + offloaded optimizer",
     [](ModelOptions& o) {
         o.offload_residual = o.offload_gradients = o.recompute_block = true;
         o.offload_master = o.offload_opt_m = o.offload_opt_v = true;
     }},
};

// Each combination on untied (4 layers: the backward loads residuals back) and tied (2 layers: no
// loads, so only the end-of-pass join brings the copies back into the capture) shapes, bf16 and FP8.
TEST(CudaGraphsOffload, BitIdenticalToTheRunWithoutGraphs) {
    QTRAIN_REQUIRE_GPU();
    const ModelShape shapes[] = {{"untied, 4 layers", 97, 128, 96, 4, 2, 1, false},
                                 {"tied, 2 layers", 97, 256, 160, 2, 4, 2, true}};
    const int B = 2, T = 64;
    for (const ModelShape& shape : shapes)
        for (bool fp8 : {false, true})
            for (const Combo& c : kCombos) {
                SCOPED_TRACE(std::string(c.name) + ", " + shape.name + (fp8 ? ", fp8" : ", bf16"));
                const ModelConfig cfg = small_config(shape);
                ModelOptions o = graph_options(fp8, B, T);
                c.apply(o);
                const std::vector<float> eager = train(cfg, o);
                o.use_cuda_graphs = true;
                const std::vector<float> graphs = train(cfg, o);
                ASSERT_EQ(graphs.size(), eager.size());
                const std::size_t first_diff = first_bit_difference(graphs, eager);
                EXPECT_EQ(first_diff, graphs.size()) << "first difference at value " << first_diff;
            }
}

// The plan accepts graphs with either offload (and with weight streaming), and refuses offloaded
// gradients over several ranks under graphs by naming the flags and the reason. No GPU needed.
TEST(CudaGraphsOffload, PlanAcceptsTheOffloadsAndNamesWhatItRefuses) {
    const ModelConfig cfg = preset_config("Qwen2.5-7B");
    ModelOptions o = graph_options(true, 4, 1024);
    o.use_cuda_graphs = o.recompute_block = true;
    o.offload_residual = o.offload_gradients = true;
    EXPECT_NO_THROW(CudaModel::plan(cfg, o));
    for (bool fp8 : {false, true})  // (and every combination the GPU test above trains)
        for (const Combo& c : kCombos) {
            ModelOptions g = graph_options(fp8, 2, 64);
            c.apply(g);
            g.use_cuda_graphs = true;
            EXPECT_NO_THROW(CudaModel::plan(small_config({"tiny", 97, 128, 96, 4, 2, 1, false}), g)) << c.name;
        }
    ModelOptions streamed = o;  // (weight streaming under graphs: cuda_graphs_stream_test.cpp)
    streamed.shard_weights = true;
    EXPECT_NO_THROW(CudaModel::plan(cfg, streamed));
    ModelOptions ranks = o;
    ranks.gpus = 2;
    ranks.shard_gradients = true;
    EXPECT_ERROR(CudaModel::plan(cfg, ranks), "--use-cuda-graphs", "--offload-gradients", "--gpus=1");
}

}  // namespace
