// Resuming on the GPU: a checkpoint written by CudaModel::save_checkpoint and read back into a fresh
// model must continue exactly as the model that wrote it (losses, gradient norms, weights and Adam
// moments bit-identical), for each precision and offload mode; and `train --device=cuda --continue`
// must reproduce the uninterrupted run.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "gpu_model_fixture.h"
#include "io/safetensors.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

// Three layers (odd, for the two streaming slots); `wide` is tests/reference/tiny-config's shape.
ModelConfig resume_config(bool tied, bool wide) {
    // head_dim 64 both ways (hidden / heads)
    return small_config({"resume", wide ? 1000 : 97, wide ? 256 : 128, wide ? 512 : 96, 3, wide ? 4 : 2, wide ? 2 : 1,
                         tied});
}

// Runs steps [first, last] (1-based) with `micro_batches` each; appends loss and grad norm.
void train(CudaModel& m, int first, int last, int B, int T, int micro_batches, std::vector<float>* out) {
    const int vocab = m.config().vocab_size;
    for (int step = first; step <= last; ++step) {
        for (int micro = 0; micro < micro_batches; ++micro) {
            Tokens d = random_tokens(B, T, vocab, 1000 * step + micro, Masked::None);
            m.forward_backward(Batch{d.in.data(), d.tgt.data(), B, T}, 1.0f / micro_batches);
        }
        StepStats s = m.optimizer_step({3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step});
        out->push_back(s.loss);
        out->push_back(s.grad_norm);
    }
}

std::vector<float> state(const CudaModel& m) {
    std::vector<float> out;
    for (const ParamSpec& s : m.layout().specs)
        for (auto which : {CudaModel::Which::Master, CudaModel::Which::Weights, CudaModel::Which::AdamM,
                           CudaModel::Which::AdamV}) {
            auto v = m.download(s.name, which);
            out.insert(out.end(), v.begin(), v.end());
        }
    return out;
}

std::size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
    return a.size();
}

struct Mode {
    const char* name;
    void (*apply)(ModelOptions&);
};

const Mode kModes[] = {
    {"bf16", [](ModelOptions&) {}},
    {"bf16 moments", [](ModelOptions& o) { o.opt_m_dtype = o.opt_v_dtype = DType::BF16; }},
    {"e4m3", [](ModelOptions& o) { o.matmul_dtype = DType::E4M3; }},
    {"offloaded optimizer", [](ModelOptions& o) { o.offload_master = o.offload_opt_m = o.offload_opt_v = true; }},
    {"bf16 master", [](ModelOptions& o) { o.master_dtype = o.opt_m_dtype = o.opt_v_dtype = DType::BF16; }},
    {"streamed weights and gradients, e4m3",
     [](ModelOptions& o) {
         o.matmul_dtype = DType::E4M3;
         o.shard_weights = o.offload_gradients = o.shard_gradients = o.offload_master = true;
     }},
    {"streamed, bf16 master, e4m3",
     [](ModelOptions& o) {
         o.matmul_dtype = DType::E4M3;
         o.master_dtype = DType::BF16;
         o.shard_weights = o.offload_gradients = o.shard_gradients = o.offload_opt_m = o.offload_opt_v = true;
     }},
    {"streamed, double-buffered optimizer",
     [](ModelOptions& o) {
         o.shard_weights = o.offload_gradients = o.shard_gradients = o.offload_master = true;
         o.offload_opt_m = o.offload_opt_v = o.offload_double_buffer = true;
         o.optimizer_chunk = 2048;
     }},
    {"streamed, bf16 master and gradients, e4m3",  // the 14B-on-24GB configuration
     [](ModelOptions& o) {
         o.matmul_dtype = DType::E4M3;
         o.master_dtype = o.param_grad_dtype = DType::BF16;
         o.shard_weights = o.offload_gradients = o.shard_gradients = o.offload_opt_m = o.offload_opt_v = true;
     }},
};

}  // namespace

class Resume : public ::testing::TestWithParam<int> {};

TEST_P(Resume, CheckpointContinuesBitIdentically) {
    QTRAIN_REQUIRE_GPU();
    const Mode& mode = kModes[GetParam()];
    for (int variant = 0; variant < 3; ++variant) {
        // untied with two micro-batches per step, tied, and the wide shape with one micro-batch
        const bool tied = variant == 1, wide = variant == 2;
        const int B = wide ? 4 : 2, T = wide ? 128 : 64, micro = wide ? 1 : 2;
        SCOPED_TRACE(std::string(mode.name) + (tied ? ", tied" : ", untied") + (wide ? ", wide" : ""));
        const ModelConfig cfg = resume_config(tied, wide);
        ModelOptions o;
        o.batch_size = B;
        o.seq_len = T;
        o.model_dtype = o.matmul_dtype = o.gradient_dtype = DType::BF16;
        mode.apply(o);
        TempDir dir;

        CudaModel a(cfg, o);
        a.init_random(3);
        std::vector<float> la, lb;
        train(a, 1, 3, B, T, micro, &la);
        a.save_checkpoint(dir.str());
        const std::vector<float> saved = state(a);
        train(a, 4, 6, B, T, micro, &la);

        CudaModel b(cfg, o);
        if (tied) b.init_random(99);  // other weights: the checkpoint must replace every one of them
        b.load_checkpoint(dir.str());  // (untied: straight after construction, as `train --continue` does)
        const std::vector<float> loaded = state(b);
        EXPECT_EQ(first_difference(loaded, saved), saved.size()) << "the loaded state differs from the saved one";
        train(b, 4, 6, B, T, micro, &lb);
        const std::vector<float> tail(la.begin() + 6, la.end());
        ASSERT_EQ(lb.size(), tail.size());
        for (std::size_t i = 0; i < tail.size(); ++i)
            EXPECT_EQ(lb[i], tail[i]) << (i % 2 ? "grad norm" : "loss") << " of step " << 4 + i / 2;
        const auto sa = state(a), sb = state(b);
        EXPECT_EQ(first_difference(sb, sa), sa.size()) << "the final state differs";
    }
}

INSTANTIATE_TEST_SUITE_P(Modes, Resume, ::testing::Range(0, static_cast<int>(std::size(kModes))),
                         [](const auto& info) {
                             std::string n = kModes[info.param].name;
                             for (char& c : n)
                                 if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                             return n;
                         });

// The end-to-end form of the same promise, through the `train` program (the CPU test of the same name
// is in tests/train/train_cli_test.cpp).
TEST(TrainCliGpu, ContinueReproducesTheUninterruptedRunExactly) {
    QTRAIN_REQUIRE_GPU();
    using namespace qtrain::test::train_cli;
    for (const char* extra : {"", " --matmul-dtype=e4m3 --opt-m-dtype=bf16 --opt-v-dtype=bf16"}) {
        SCOPED_TRACE(extra);
        Fixture f(kGpuShape);
        expect_continue_reproduces_full_run(f, "cuda", extra);
    }
}
