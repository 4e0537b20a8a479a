// Two GPU LoRA models built from different options (recompute, CUDA graphs, the FP8 base's layouts,
// --train-also, ...) must agree bit for bit: same init, the same non-zero B on both, three AdamW steps
// of two micro-batches each; losses, norms, every trained tensor's master and moments, and an
// evaluation after. Written once for the LoRA GPU tests.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "gpu_model_fixture.h"
#include "model/cuda/cuda_model.h"

namespace qtrain::test {

inline void expect_lora_steps_bit_identical(const ModelOptions& a_opts, const ModelOptions& b_opts,
                                            const ModelConfig& cfg) {
    const int B = a_opts.batch_size, T = a_opts.seq_len;
    CudaModel a(cfg, a_opts), b(cfg, b_opts);
    a.init_random(9);
    b.init_random(9);
    Rng rng(3);
    for (const ParamSpec& s : a.lora()->host().specs()) {  // non-zero B on both
        std::vector<float> v = a.download(s.name, CudaModel::Which::Master);
        if (s.name.find(".lora_B.") != std::string::npos)
            for (float& x : v) x = 0.05f * rng.normal();
        a.upload_master(s.name, v.data());
        b.upload_master(s.name, v.data());
    }
    for (int step = 1; step <= 3; ++step) {
        for (int micro = 0; micro < 2; ++micro) {
            const Tokens d = random_tokens(B, T, cfg.vocab_size, 100 * step + micro, Masked::Every11thFrom3);
            a.forward_backward(d.batch(B, T), 0.5f);
            b.forward_backward(d.batch(B, T), 0.5f);
        }
        const OptimizerParams op{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step};
        const StepStats sa = a.optimizer_step(op), sb = b.optimizer_step(op);
        EXPECT_EQ(sa.loss, sb.loss) << "step " << step;
        EXPECT_EQ(sa.grad_norm, sb.grad_norm) << "step " << step;
    }
    for (const ParamSpec& s : a.lora()->host().specs())
        for (auto w : {CudaModel::Which::Master, CudaModel::Which::AdamM, CudaModel::Which::AdamV})
            EXPECT_EQ(a.download(s.name, w), b.download(s.name, w)) << s.name;
    const Tokens e = random_tokens(B, T, cfg.vocab_size, 999, Masked::Every11thFrom3);
    EXPECT_EQ(a.evaluate(e.batch(B, T)), b.evaluate(e.batch(B, T)));
}

}  // namespace qtrain::test
