// The --lora-* flags (issue 33): what the model is told, and the errors that name flag and value.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/model_backends.h"
#include "core/error.h"
#include "model/lora.h"
#include "model/model_config.h"
#include "test_util.h"
#include "train/train_options.h"

namespace qtrain {
namespace {

std::string validate_message(const std::vector<std::string>& args) {
    try {
        TrainOptions o = train_options_from_args(args);
        o.model = "m";
        o.train_file = "t.bin";
        o.validate();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(LoraOptions, FlagsReachTheModel) {
    const TrainOptions o = train_options_from_args(
        {"--lora-rank=16", "--lora-alpha=32", "--lora-targets=q,v,down", "--lora-init=gaussian", "--seed=7"});
    const ModelOptions m = o.model_options("cpu");
    EXPECT_EQ(m.lora.rank, 16);
    EXPECT_FLOAT_EQ(m.lora.alpha, 32.0f);
    EXPECT_FLOAT_EQ(m.lora.scale(), 2.0f);
    EXPECT_TRUE(m.lora.has(LoraTarget::Q) && m.lora.has(LoraTarget::V) && m.lora.has(LoraTarget::Down));
    EXPECT_FALSE(m.lora.has(LoraTarget::K) || m.lora.has(LoraTarget::O) || m.lora.has(LoraTarget::Gate) ||
                 m.lora.has(LoraTarget::Up));
    EXPECT_EQ(lora_targets_text(m.lora.targets), "q,v,down");
    EXPECT_EQ(m.lora.init, "gaussian");
    EXPECT_EQ(m.lora.seed, 7u);
    // the defaults: off, PEFT's alpha 8, every target
    const ModelOptions d = TrainOptions().model_options("cpu");
    EXPECT_FALSE(d.lora.enabled());
    EXPECT_FLOAT_EQ(d.lora.alpha, 8.0f);
    EXPECT_EQ(lora_targets_text(d.lora.targets), "q,k,v,o,gate,up,down");
    EXPECT_EQ(validate_message({"--lora-rank=8"}), "");
}

TEST(LoraOptions, BadValuesNameFlagAndValue) {
    const std::string unknown = validate_message({"--lora-rank=4", "--lora-targets=q,qkv"});
    EXPECT_NE(unknown.find("--lora-targets=q,qkv"), std::string::npos) << unknown;
    EXPECT_NE(unknown.find("'qkv'"), std::string::npos) << unknown;
    for (const std::string flag : {"--lora-alpha=16", "--lora-targets=q", "--lora-init=gaussian", "--lora-dropout=0.1"}) {
        const std::string m = validate_message({flag});
        EXPECT_NE(m.find(flag.substr(0, flag.find('=')) + " needs --lora-rank > 0"), std::string::npos) << m;
    }
    EXPECT_EQ(validate_message({"--lora-rank=4", "--lora-dropout=0.1"}), "");
    const std::string dropout = validate_message({"--lora-rank=4", "--lora-dropout=1"});
    EXPECT_NE(dropout.find("--lora-dropout must be in [0, 1)"), std::string::npos) << dropout;
    EXPECT_NE(validate_message({"--lora-rank=4", "--lora-alpha=0"}).find("--lora-alpha"), std::string::npos);
    EXPECT_NE(validate_message({"--lora-rank=-1"}).find("--lora-rank"), std::string::npos);
    EXPECT_NE(validate_message({"--lora-rank=4", "--lora-init=pissa"}).find("--lora-init"), std::string::npos);
}

// The GPU model trains adapters on a frozen, resident base on one GPU (lora_adapters.h). Its plan needs
// no GPU: the base keeps its model-dtype weights and nothing else (no master, gradient or moments), the
// adapters their state; what this slice does not do yet is refused naming the flag.
TEST(LoraOptions, CudaPlanShowsTheFrozenBaseAndRefusesWhatIsNotWrittenYet) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "this build has no CUDA backend";
#else
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    const std::vector<std::string> base = {"--seq-len=16", "--batch-size=1"};
    auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.end(), base.begin(), base.end());
        return train_options_from_args(extra).model_options("cuda");
    };
    auto bytes = [](const MemoryPlan& p, const std::string& category) {
        for (const auto& e : p.entries)
            if (e.category == category) return static_cast<int64_t>(e.device_bytes);
        return int64_t{-1};
    };
    const MemoryPlan full = plan_model(cfg, with({}), "cuda");
    const MemoryPlan lora = plan_model(cfg, with({"--lora-rank=8"}), "cuda");
    EXPECT_EQ(bytes(lora, "Weights"), bytes(full, "Weights"));
    for (const char* frozen : {"Master", "Gradients", "Adam M", "Adam V"}) {
        EXPECT_GT(bytes(full, frozen), 0) << frozen;
        EXPECT_EQ(bytes(lora, frozen), 0) << frozen;
    }
    // the adapters: fp32 master, gradient and two moments, and a bf16 copy of every A [8, in] and B [out, 8]
    int64_t adapters = 0;
    for (const ParamSpec& s : lora_parameters(cfg, with({"--lora-rank=8"}).lora)) adapters += (s.numel() + 63) / 64 * 64;
    EXPECT_GE(bytes(lora, "LoRA adapters"), adapters * (4 * 4 + 2));
    EXPECT_LT(bytes(lora, "LoRA adapters"), adapters * (4 * 4 + 2) + (1 << 20));
    EXPECT_GT(bytes(lora, "LoRA activations"), 0);
    EXPECT_EQ(bytes(full, "LoRA adapters"), -1);  // (not in a plan without LoRA)
    EXPECT_LT(lora.total_device(), full.total_device());

    for (const std::string flag : {"--offload-gradients", "--offload-master", "--offload-opt-m"})
        EXPECT_ERROR(plan_model(cfg, with({"--lora-rank=8", flag}), "cuda"), "--lora-rank=8", flag,
                     "not yet supported on --device=cuda");
    // several ranks: every rank holds the whole frozen base and the adapters (replicated, ZeRO-1), the
    // same plan as one GPU's but for the per-rank scalars; ZeRO-2 would shard a gradient there is none of
    ModelOptions two = with({"--lora-rank=8"});
    two.gpus = 2;
    const MemoryPlan lora2 = plan_model(cfg, two, "cuda");
    EXPECT_EQ(bytes(lora2, "Weights"), bytes(lora, "Weights"));
    // ZeRO-1/2 of the adapters: each rank keeps its block (half) of the fp32 master and moments,
    // the whole gradient and model-dtype weights (padded to the blocks)
    EXPECT_LT(bytes(lora2, "LoRA adapters"), bytes(lora, "LoRA adapters"));
    EXPECT_EQ(bytes(lora2, "Adam M"), 0);
    ModelOptions zero2 = with({"--lora-rank=8", "--zero-level=2"});
    zero2.gpus = 2;
    EXPECT_EQ(bytes(plan_model(cfg, zero2, "cuda"), "LoRA adapters"), bytes(lora2, "LoRA adapters"));
    // a rank above a target's dimensions, before any GPU is asked for
    EXPECT_ERROR(plan_model(cfg, with({"--lora-rank=4000"}), "cuda"), "--lora-rank=4000", "larger than");
#endif
}

// The FP8 base (--matmul-dtype=e4m3 under LoRA): the plan shows one byte per base element in
// "Quants" (the e4m3 copy the forward reads; with FP8 gradients of the layers only, whose transposes
// the backward makes one matrix at a time in "Transpose scratch", the largest matrix's bytes), no
// master / gradients / moments, and none of the full FP8 run's transposed inputs (no dW). With bf16 gradients the bf16 base stays in "Weights" (the input-gradient GEMMs read it); with
// FP8 gradients its layer matrices are gone from there (the norms, biases, embedding and head stay).
TEST(LoraOptions, CudaPlanShowsTheFp8Base) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "this build has no CUDA backend";
#else
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.end(), {"--seq-len=256", "--batch-size=2", "--model-dtype=bf16"});
        return train_options_from_args(extra).model_options("cuda");
    };
    auto bytes = [](const MemoryPlan& p, const std::string& category) {
        for (const auto& e : p.entries)
            if (e.category == category) return static_cast<int64_t>(e.device_bytes);
        return int64_t{-1};
    };
    const MemoryPlan bf16 = plan_model(cfg, with({"--lora-rank=8"}), "cuda");
    for (const char* grad : {"bf16", "e5m2"}) {
        SCOPED_TRACE(grad);
        const std::string g = std::string("--gradient-dtype=") + grad;
        const MemoryPlan fp8 = plan_model(cfg, with({"--lora-rank=8", "--matmul-dtype=e4m3", g}), "cuda");
        const MemoryPlan full = plan_model(cfg, with({"--matmul-dtype=e4m3", g}), "cuda");
        const bool fp8_grads = std::string(grad) != "bf16";
        // bf16 gradients: the full FP8 run's e4m3 copy, one byte per element (and padding); FP8
        // gradients: one copy of the layers only (the embedding and head are not FP8 base matrices),
        // and one scratch matrix for the transposes (0.5B's largest: gate|up, [2I, h])
        const int64_t layers = cfg.num_parameters() - cfg.vocab_size * cfg.hidden_size - cfg.hidden_size;  // (tied)
        const int64_t kept = fp8_grads ? layers : cfg.num_parameters();
        if (!fp8_grads) EXPECT_EQ(bytes(fp8, "Quants"), bytes(full, "Quants"));
        else EXPECT_LT(bytes(fp8, "Quants"), bytes(full, "Quants") / 2);
        EXPECT_GE(bytes(fp8, "Quants"), kept);
        EXPECT_LT(bytes(fp8, "Quants"), kept + (1 << 20));
        EXPECT_EQ(bytes(fp8, "Transpose scratch"),
                  fp8_grads ? 2 * cfg.intermediate_size * cfg.hidden_size : int64_t{-1});
        EXPECT_EQ(bytes(full, "Transpose scratch"), -1);  // (the full FP8 run keeps its transposes)
        EXPECT_EQ(bytes(bf16, "Quants"), -1);
        if (!fp8_grads) EXPECT_EQ(bytes(fp8, "Weights"), bytes(bf16, "Weights"));
        else EXPECT_LT(bytes(fp8, "Weights"), bytes(bf16, "Weights") / 2);  // (0.5B: the tied embedding is big)
        for (const char* frozen : {"Master", "Gradients", "Adam M", "Adam V"}) EXPECT_EQ(bytes(fp8, frozen), 0) << frozen;
        EXPECT_EQ(bytes(fp8, "LoRA adapters"), bytes(bf16, "LoRA adapters"));
        // the full FP8 run with FP8 gradients keeps x^T of every matrix input for dW; the FP8 base keeps
        // none: the activations are the bf16 base's (the inputs per layer, for the adapters' backward)
        EXPECT_EQ(bytes(fp8, "Activations"), bytes(bf16, "Activations"));
        if (fp8_grads) EXPECT_NE(bytes(full, "Activations"), bytes(bf16, "Activations"));
    }
    // (streaming: CudaPlanShowsTheStreamedFp8Base)
#endif
}

// The FP8 base streamed from host memory (--shard-weights under LoRA with FP8 gradients, one GPU): the
// layers' e4m3 codes move from "Quants" to the pinned "Streamed base" (the same bytes), and the device
// keeps two layer slots ("Weight slots", one layer span of codes each) instead; the model-dtype tensors
// (norms, biases, embedding, head), the transpose scratch, the activations and the adapters do not
// change. Untied models keep their embedding resident too (the full model's streaming reads its rows
// from the host). The remaining refusals name their flags.
TEST(LoraOptions, CudaPlanShowsTheStreamedFp8Base) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "this build has no CUDA backend";
#else
    auto device = [](const MemoryPlan& p, const std::string& category) {
        for (const auto& e : p.entries)
            if (e.category == category) return static_cast<int64_t>(e.device_bytes);
        return int64_t{-1};
    };
    auto pinned = [](const MemoryPlan& p, const std::string& category) {
        for (const auto& e : p.entries)
            if (e.category == category) return static_cast<int64_t>(e.pinned_bytes);
        return int64_t{-1};
    };
    for (const char* preset : {"Qwen2.5-0.5B", "Qwen3-0.6B", "Llama-3.1-8B"}) {  // (tied, tied, untied)
        for (const char* grad : {"e4m3", "e5m2"}) {
            SCOPED_TRACE(std::string(preset) + " " + grad);
            const ModelConfig cfg = preset_config(preset);
            auto with = [&](std::vector<std::string> extra) {
                extra.insert(extra.end(), {"--seq-len=256", "--batch-size=2", "--model-dtype=bf16", "--lora-rank=8",
                                           "--matmul-dtype=e4m3", std::string("--gradient-dtype=") + grad});
                return train_options_from_args(extra).model_options("cuda");
            };
            const MemoryPlan resident = plan_model(cfg, with({}), "cuda");
            const MemoryPlan streamed = plan_model(cfg, with({"--shard-weights"}), "cuda");
            // one layer's elements: its four matrices (q|k|v, o, gate|up, down) and its norms and biases
            const int64_t h = cfg.hidden_size, I = cfg.intermediate_size, L = cfg.num_hidden_layers;
            const int64_t matrices = (cfg.q_dim() + 2 * cfg.kv_dim()) * h + h * cfg.q_dim() + 3 * I * h;
            const int64_t layer = matrices + 8 * h + 2 * 64 * 64;  // (norms, biases, q/k norms, padding: generous)
            EXPECT_EQ(pinned(streamed, "Streamed base"), device(resident, "Quants"));
            EXPECT_EQ(device(streamed, "Streamed base"), 0);
            EXPECT_GE(pinned(streamed, "Streamed base"), L * matrices);
            EXPECT_LE(pinned(streamed, "Streamed base"), L * layer + (1 << 20));
            EXPECT_EQ(device(streamed, "Quants"), -1);  // (no FP8 head: nothing else is quantised)
            EXPECT_GE(device(streamed, "Weight slots"), 2 * matrices);
            EXPECT_LE(device(streamed, "Weight slots"), 2 * layer + 512);
            EXPECT_EQ(pinned(streamed, "Weight slots"), 0);
            for (const char* same : {"Weights", "Transpose scratch", "Activations", "Workspace", "LoRA adapters",
                                     "LoRA activations"}) {
                EXPECT_EQ(device(streamed, same), device(resident, same)) << same;
                EXPECT_EQ(pinned(streamed, same), pinned(resident, same)) << same;
            }
            EXPECT_EQ(pinned(streamed, "Weights"), 0);  // (the embedding of an untied model stays resident)
            EXPECT_EQ(device(resident, "Streamed base"), -1);
            EXPECT_EQ(streamed.total_device() + pinned(streamed, "Streamed base"),
                      resident.total_device() + device(streamed, "Weight slots"));
            // the FP8 head's copies stay resident in "Quants"
            const MemoryPlan head = plan_model(cfg, with({"--shard-weights", "--lm-head-dtype=e4m3"}), "cuda");
            EXPECT_GE(device(head, "Quants"), 2 * cfg.vocab_size * h);
            EXPECT_EQ(pinned(head, "Streamed base"), pinned(streamed, "Streamed base"));
        }
    }
    // The bf16 base streamed (bf16 gradients; bf16 or e4m3 matmuls): the full model's streaming, its
    // whole bf16 copy pinned in "Weights" and two bf16 layer slots with the non-layer weights on the
    // device (e4m3 matmuls: two e4m3 slots in "Quants", quantised on arrival)
    for (const char* matmul : {"bf16", "e4m3"}) {
        SCOPED_TRACE(matmul);
        const ModelConfig cfg = preset_config("Llama-3.1-8B");  // (untied: its embedding is read from the host)
        auto with = [&](std::vector<std::string> extra) {
            extra.insert(extra.end(), {"--seq-len=256", "--batch-size=2", "--model-dtype=bf16", "--lora-rank=8",
                                       std::string("--matmul-dtype=") + matmul});
            return train_options_from_args(extra).model_options("cuda");
        };
        const MemoryPlan resident = plan_model(cfg, with({}), "cuda");
        const MemoryPlan streamed = plan_model(cfg, with({"--shard-weights"}), "cuda");
        EXPECT_EQ(pinned(streamed, "Weights"), device(resident, "Weights"));
        EXPECT_EQ(device(streamed, "Weights"), 0);
        const int64_t h = cfg.hidden_size, I = cfg.intermediate_size;
        const int64_t matrices = (cfg.q_dim() + 2 * cfg.kv_dim()) * h + h * cfg.q_dim() + 3 * I * h;
        // two bf16 layer spans, the final norm and the LM head (the embedding stays on the host)
        EXPECT_GE(device(streamed, "Weight slots"), 2 * 2 * matrices + 2 * cfg.vocab_size * h);
        EXPECT_LT(device(streamed, "Weight slots"), 2 * 2 * matrices + 2 * cfg.vocab_size * h + (1 << 20));
        if (std::string(matmul) == "e4m3") EXPECT_LT(device(streamed, "Quants"), 2 * matrices + (1 << 20));
        else EXPECT_EQ(device(streamed, "Quants"), -1);
        EXPECT_EQ(device(streamed, "Streamed base"), -1);
        for (const char* same : {"Activations", "LoRA adapters", "LoRA activations"})
            EXPECT_EQ(device(streamed, same), device(resident, same)) << same;
        EXPECT_LT(streamed.total_device(), resident.total_device() / 2);
    }
    // what stays refused names its flags
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    auto plan = [&](std::vector<std::string> extra) {
        extra.insert(extra.end(), {"--seq-len=256", "--batch-size=2", "--model-dtype=bf16", "--lora-rank=8",
                                   "--shard-weights"});
        ModelOptions o = train_options_from_args(extra).model_options("cuda");
        return plan_model(cfg, o, "cuda");
    };
    // (--train-also with the streamed bf16 base on one GPU: written into its host copy since session 24;
    // ZeRO-3's block of it stays refused, lora_zero3_plan_test.cpp)
    EXPECT_NO_THROW(plan({"--train-also=norms,embeddings"}));
    EXPECT_ERROR(plan({"--matmul-dtype=e4m3", "--gradient-dtype=e5m2", "--persistent-quants"}), "--lora-rank=8",
                 "--shard-weights", "--persistent-quants");
    EXPECT_ERROR(plan({"--matmul-dtype=e4m3", "--gradient-dtype=e5m2", "--offload-quants"}), "--lora-rank=8",
                 "--offload-quants");
    // (CUDA graphs capture the streamed base's copies: one graph per state of its slots, weights.h)
    EXPECT_NO_THROW(plan({"--matmul-dtype=e4m3", "--gradient-dtype=e5m2", "--use-cuda-graphs"}));
    EXPECT_ERROR(plan({"--matmul-dtype=e4m3", "--gradient-dtype=e5m2", "--offload-gradients"}), "--lora-rank=8",
                 "--offload-gradients", "not yet supported");
    ModelOptions two = train_options_from_args({"--seq-len=256", "--batch-size=2", "--model-dtype=bf16", "--lora-rank=8",
                                                "--matmul-dtype=e4m3", "--gradient-dtype=e5m2", "--shard-weights"})
                           .model_options("cuda");
    two.gpus = 2;
    ASSERT_TRUE(two.shard_weights);
    // (with several ranks --shard-weights is ZeRO-3 of the frozen base: lora_zero3_plan_test.cpp)
    EXPECT_NO_THROW(plan_model(cfg, two, "cuda"));
#endif
}

// Qwen2.5-32B and 14B LoRA (rank 16, every target, seq 2048) on the streamed FP8 base fit a 24 GiB card
// (the plan leaves out the ~0.7 GiB CUDA context: under 23 GiB) with the flags README's recipe gives.
TEST(LoraOptions, CudaPlanStreamedFp8BaseFits24GiB) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "this build has no CUDA backend";
#else
    const int64_t limit = int64_t{23} << 30;
    for (const char* preset : {"Qwen2.5-32B", "Qwen2.5-14B"}) {
        SCOPED_TRACE(preset);
        const ModelOptions o = train_options_from_args({"--seq-len=2048", "--batch-size=1", "--model-dtype=bf16",
                                                        "--lora-rank=16", "--matmul-dtype=e4m3", "--gradient-dtype=e5m2",
                                                        "--shard-weights", "--recompute-block", "--lmhead-chunks=8"})
                                   .model_options("cuda");
        const MemoryPlan p = plan_model(preset_config(preset), o, "cuda");
        EXPECT_LT(static_cast<int64_t>(p.total_device()), limit);
        EXPECT_GT(p.total_pinned(), preset_config(preset).num_parameters() / 2);  // (the codes: ~1 byte per weight)
    }
#endif
}

// --train-also on the GPU (lora_layout.h): the trained norms / embeddings / head get their fp32 master,
// gradient and two moments (and a model-dtype copy, as each adapter) in "LoRA adapters", each on a
// 64-element boundary; the base's arenas do not change (their values stay in "Weights", no master,
// gradient or moments there). An FP8 LM head with trained embeddings is refused naming both flags.
TEST(LoraOptions, CudaPlanShowsTheTrainAlsoTensors) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "this build has no CUDA backend";
#else
    for (const char* preset : {"Qwen2.5-0.5B", "Qwen3-0.6B", "Llama-3.1-8B"}) {  // (tied, tied, untied)
        SCOPED_TRACE(preset);
        const ModelConfig cfg = preset_config(preset);
        auto with = [&](std::vector<std::string> extra) {
            extra.insert(extra.end(), {"--seq-len=16", "--batch-size=1", "--model-dtype=bf16", "--lora-rank=8"});
            return train_options_from_args(extra).model_options("cuda");
        };
        auto bytes = [](const MemoryPlan& p, const std::string& category) {
            for (const auto& e : p.entries)
                if (e.category == category) return static_cast<int64_t>(e.device_bytes);
            return int64_t{-1};
        };
        const MemoryPlan plain = plan_model(cfg, with({}), "cuda");
        for (const char* also : {"norms", "embeddings", "norms,embeddings"}) {
            SCOPED_TRACE(also);
            const ModelOptions o = with({std::string("--train-also=") + also});
            const MemoryPlan plan = plan_model(cfg, o, "cuda");
            int64_t padded = 0;  // the trained tensors' elements, each padded to 64
            for (const ParamSpec& s : lora_train_also_parameters(cfg, o.lora)) padded += (s.numel() + 63) / 64 * 64;
            ASSERT_GT(padded, 0);
            // fp32 master, gradient, Adam M and V, and the bf16 copy (arena alignment: a few bytes more)
            const int64_t extra = bytes(plan, "LoRA adapters") - bytes(plain, "LoRA adapters");
            EXPECT_GE(extra, padded * (4 * 4 + 2));
            EXPECT_LT(extra, padded * (4 * 4 + 2) + 4096);
            for (const char* same : {"Weights", "Master", "Gradients", "Adam M", "Adam V", "LoRA activations"})
                EXPECT_EQ(bytes(plan, same), bytes(plain, same)) << same;
        }
        // the embeddings of a tied model are one matrix (embed_tokens), of an untied one two (and lm_head)
        const ModelOptions both = with({"--train-also=norms,embeddings"});
        int64_t matrices = 0;
        for (const ParamSpec& s : lora_train_also_parameters(cfg, both.lora))
            matrices += s.numel() == int64_t{cfg.vocab_size} * cfg.hidden_size;
        EXPECT_EQ(matrices, cfg.tie_word_embeddings ? 1 : 2);
        // a trained FP8 LM head (session 24): planned, with its dW operands (one chunk's d(logits)^T and x^T)
        const MemoryPlan trained = plan_model(
            cfg, with({"--train-also=embeddings", "--matmul-dtype=e4m3", "--gradient-dtype=e5m2", "--lm-head-dtype=e4m3"}),
            "cuda");
        const MemoryPlan frozen_head = plan_model(
            cfg, with({"--train-also=norms", "--matmul-dtype=e4m3", "--gradient-dtype=e5m2", "--lm-head-dtype=e4m3"}),
            "cuda");
        EXPECT_GT(bytes(trained, "Workspace"), bytes(frozen_head, "Workspace"));
        EXPECT_NO_THROW(plan_model(cfg, with({"--train-also=norms", "--matmul-dtype=e4m3", "--lm-head-dtype=e4m3"}),
                                   "cuda"));
    }
#endif
}

}  // namespace
}  // namespace qtrain
