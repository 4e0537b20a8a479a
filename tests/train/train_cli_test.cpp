// End-to-end tests of the `train` program on the CPU reference model: the issue's "done when"
// command, resume after a checkpoint, the HF export, and clear errors on bad input.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "io/safetensors.h"
#include "io/token_file.h"
#include "model/memory_plan.h"
#include "model/model_config.h"
#include "test_util.h"
#include "train/train_cli_fixture.h"
#include "backends/model_backends.h"
#include "train/model_source.h"
#include "train/train_options.h"
#ifdef QTRAIN_HAVE_CUDA
#include "cuda/attention_cudnn.h"
#endif

using namespace qtrain;
using namespace qtrain::test;
namespace fs = std::filesystem;

using namespace qtrain::test::train_cli;

TEST(TrainCli, DoneWhenCommandTrainsEvaluatesCheckpointsAndExports) {
    Fixture f;
    auto r = run_command(f.base_cmd("run") + " --steps=40 --ckpt-interval=20 --eval-every-n-steps=20");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "[T] step     0"));
    EXPECT_TRUE(Contains(r.output, "[V] step    20"));
    EXPECT_TRUE(Contains(r.output, "[Allocator State]"));
    EXPECT_TRUE(Contains(r.output, "| sol "));
    EXPECT_TRUE(fs::exists(f.dir / "run-ckpt/step_00000020/state.json"));
    EXPECT_TRUE(fs::exists(f.dir / "run-ckpt/step_00000040/state.json"));
    EXPECT_TRUE(fs::exists(f.dir / "run/model.safetensors"));
    EXPECT_TRUE(fs::exists(f.dir / "run/config.json"));

    auto losses = step_losses(f.dir / "run/log.jsonl");
    ASSERT_EQ(losses.size(), 40u);
    double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[37] + losses[38] + losses[39]) / 3;
    EXPECT_GT(losses[0], 3.5);              // ~log(64) = 4.16 at init
    EXPECT_LT(last, first - 1.0) << "loss did not fall: " << first << " -> " << last;

    // the export is a HF Qwen2 checkpoint with every tensor
    SafeTensorsReader st({f.dir / "run/model.safetensors"});
    EXPECT_TRUE(st.has("model.embed_tokens.weight"));
    EXPECT_TRUE(st.has("lm_head.weight"));
    EXPECT_TRUE(st.has("model.layers.1.self_attn.k_proj.bias"));
    EXPECT_TRUE(st.has("model.norm.weight"));
}

TEST(TrainCli, ContinueReproducesTheUninterruptedRunExactly) {
    Fixture f;
    expect_continue_reproduces_full_run(f, "cpu", "");
}

TEST(TrainCli, SameSeedSameLosses) {
    Fixture f;
    auto a = run_command(f.base_cmd("a") + " --steps=3 --eval-every-n-steps=0");
    auto b = run_command(f.base_cmd("b") + " --steps=3 --eval-every-n-steps=0");
    ASSERT_EQ(a.exit_code, 0) << a.output;
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_EQ(step_losses(f.dir / "a/log.jsonl"), step_losses(f.dir / "b/log.jsonl"));
}

// The FP8 flags reach the model: on the CPU they select the FP8 emulation, which trains (the loss
// falls) and differs from the fp32 run.
TEST(TrainCli, Fp8FlagsTrainOnTheCpuEmulation) {
    Fixture f;
    auto fp8 = run_command(f.base_cmd("f") + " --steps=12 --eval-every-n-steps=0 --matmul-dtype=e4m3 --gradient-dtype=e5m2");
    auto fp32 = run_command(f.base_cmd("g") + " --steps=12 --eval-every-n-steps=0");
    ASSERT_EQ(fp8.exit_code, 0) << fp8.output;
    ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
    const auto a = step_losses(f.dir / "f/log.jsonl"), b = step_losses(f.dir / "g/log.jsonl");
    ASSERT_EQ(a.size(), 12u);
    EXPECT_LT(a.back(), a.front());
    EXPECT_NE(a, b);
}

TEST(TrainCli, PlanOnlyNeedsNoData) {
    auto r = run_command(train_exe() + " --device=cpu --model=Qwen2.5-0.5B --from-scratch --plan-only");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "[Allocator State]"));
    EXPECT_TRUE(Contains(r.output, "Adam M"));
}

TEST(TrainCli, GpuPlanOnlyNeedsNoGpu) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "built without the CUDA backend";
#endif
    auto r = run_command(train_exe() +
                         " --device=cuda --model=Qwen2.5-1.5B --from-scratch --plan-only --batch-size=8");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "[Allocator State] (cuda)"));
    EXPECT_TRUE(Contains(r.output, "Activations"));
    // a plan over --memory-limit fails before allocating, naming both numbers
    auto over = run_command(train_exe() +
                            " --device=cuda --model=Qwen2.5-7B --from-scratch --plan-only --memory-limit=24GiB");
    EXPECT_EQ(over.exit_code, 1) << over.output;
    EXPECT_TRUE(Contains(over.output, "--memory-limit is 24.00 GiB"));
}

// --plan-only with --memory-limit names the largest --batch-size that fits with the flags given (the
// streamed configurations get faster with a larger micro-batch), and an over-limit plan's error names
// it too: that size must fit and the next one must not.
TEST(TrainCli, GpuPlanOnlyNamesTheLargestBatchThatFits) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "built without the CUDA backend";
#endif
    const std::string base = train_exe() +
                             " --device=cuda --model=Qwen2.5-7B --from-scratch --plan-only --memory-limit=24GiB"
                             " --recompute-block --offload-master --offload-opt-m --offload-opt-v --opt-m-dtype=bf16"
                             " --opt-v-dtype=bf16 --shard-weights --offload-gradients --shard-gradients"
                             " --lmhead-chunks=8 --matmul-dtype=e4m3 --gradient-dtype=e5m2";
    // the batch size the plan-only note names (-1: no note)
    auto named_batch = [&](const std::string& extra) {
        const auto r = run_command(base + extra);
        const std::string key = "--batch-size up to ";
        const auto at = r.output.find(key);
        EXPECT_EQ(r.exit_code, 0) << r.output;
        return at == std::string::npos ? -1 : std::atoi(r.output.c_str() + at + key.size());
    };
    const int largest = named_batch(" --batch-size=8");
    ASSERT_GT(largest, 8);
    EXPECT_EQ(run_command(base + " --batch-size=" + std::to_string(largest)).exit_code, 0);
    auto over = run_command(base + " --batch-size=" + std::to_string(largest + 1));
    EXPECT_EQ(over.exit_code, 1) << over.output;
    EXPECT_TRUE(Contains(over.output, "with the current flags --batch-size=" + std::to_string(largest) + " fits"))
        << over.output;
    // with two attention-backward chunks only even sizes are valid, and the answer is one of them
    const int largest_even = named_batch(" --batch-size=8 --attn-bwd-chunks=2");
    ASSERT_GT(largest_even, 0);
    EXPECT_EQ(largest_even % 2, 0);
    EXPECT_GE(largest_even, largest);  // the chunked workspace is smaller
    EXPECT_EQ(run_command(base + " --attn-bwd-chunks=2 --batch-size=" + std::to_string(largest_even)).exit_code, 0);
    EXPECT_EQ(run_command(base + " --attn-bwd-chunks=2 --batch-size=" + std::to_string(largest_even + 2)).exit_code, 1);
    // streamed runs are also told how far --offload-residual takes the micro-batch: that size fits
    // with it and not without it, and the next one does not fit even with it
    const auto r = run_command(base + " --batch-size=8");
    const std::string key = "with --offload-residual as well, --batch-size up to ";
    const auto at = r.output.find(key);
    ASSERT_NE(at, std::string::npos) << r.output;
    const int with_res = std::atoi(r.output.c_str() + at + key.size());
    EXPECT_GT(with_res, largest);
    EXPECT_EQ(run_command(base + " --offload-residual --batch-size=" + std::to_string(with_res)).exit_code, 0);
    EXPECT_EQ(run_command(base + " --offload-residual --batch-size=" + std::to_string(with_res + 1)).exit_code, 1);
    // and a run that already offloads it gets no such note
    EXPECT_FALSE(Contains(run_command(base + " --offload-residual --batch-size=8").output, key));
}

// Pinned host memory is checked like device memory: a plan that pins more than --host-memory-limit
// (for a training run, default: this machine's RAM) fails before allocating and names the bf16
// precision flags that make it fit. 14B with fp32 master and gradients offloaded pins 193 GiB;
// bf16 gradients alone leave 165 GiB, bf16 master too 110 GiB.
TEST(TrainCli, GpuPinnedPlanOverTheHostLimitNamesTheBf16FlagsThatFit) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "built without the CUDA backend";
#endif
    const std::string base = train_exe() +
                             " --device=cuda --model=Qwen2.5-14B --from-scratch --plan-only --batch-size=8"
                             " --memory-limit=24GiB --recompute-block --offload-opt-m --offload-opt-v"
                             " --opt-m-dtype=bf16 --opt-v-dtype=bf16 --shard-weights --offload-gradients"
                             " --shard-gradients --lmhead-chunks=8 --matmul-dtype=e4m3";
    auto over = run_command(base + " --offload-master --host-memory-limit=125GiB");
    EXPECT_EQ(over.exit_code, 1) << over.output;
    EXPECT_TRUE(Contains(over.output, "--host-memory-limit is 125.00 GiB")) << over.output;
    EXPECT_TRUE(Contains(over.output, "it fits with --param-grad-dtype=bf16 --master-dtype=bf16 without --offload-master"))
        << over.output;
    auto fits = run_command(base + " --offload-master --host-memory-limit=200GiB");
    EXPECT_EQ(fits.exit_code, 0) << fits.output;
    auto suggested = run_command(base + " --host-memory-limit=125GiB --param-grad-dtype=bf16 --master-dtype=bf16");
    EXPECT_EQ(suggested.exit_code, 0) << "the suggested flags must fit\n" << suggested.output;
    auto hopeless = run_command(base + " --offload-master --host-memory-limit=50GiB");
    EXPECT_EQ(hopeless.exit_code, 1) << hopeless.output;
    EXPECT_TRUE(Contains(hopeless.output, "no bf16 precision flag makes it fit")) << hopeless.output;
    // --plan-only without an explicit limit only notes that this machine could not train it
    auto plan_here = run_command(base + " --offload-master");
    EXPECT_EQ(plan_here.exit_code, 0) << plan_here.output;
    const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
    if (ram < 190.0 * (1ull << 30))  // the plan pins 193 GiB
        EXPECT_TRUE(Contains(plan_here.output, "note: the plan pins 192.")) << plan_here.output;  // 197,201 MiB
    auto bad = run_command(base + " --offload-master --host-memory-limit=lots");
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_TRUE(Contains(bad.output, "--host-memory-limit")) << bad.output;
}

// The Activations line of [Allocator State] in MiB (-1 when absent).
long activations_mib(const std::string& out) {
    const auto pos = out.find("Activations");
    if (pos == std::string::npos) return -1;
    return std::stol(out.substr(pos + std::string("Activations").size()));
}

TEST(TrainCli, GpuRecomputeFlagsShrinkThePlanAndAreSuggestedWhenItDoesNotFit) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "built without the CUDA backend";
#endif
    const std::string base =
        train_exe() + " --device=cuda --model=Qwen2.5-0.5B --from-scratch --plan-only --batch-size=16";
    auto none = run_command(base);
    ASSERT_EQ(none.exit_code, 0) << none.output;
    const long full = activations_mib(none.output);
    ASSERT_GT(full, 0) << none.output;
    long previous = full;
    // each step of this ladder recomputes a superset of the one before
    for (const char* flags : {"--recompute-swiglu", "--recompute-ffn", "--recompute-ffn --recompute-norm",
                              "--recompute-ffn --recompute-norm --recompute-att", "--recompute-block"}) {
        auto r = run_command(base + " " + flags);
        ASSERT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
        const long mib = activations_mib(r.output);
        EXPECT_LT(mib, previous) << flags;
        previous = mib;
    }
    EXPECT_LT(previous, full / 5);  // --recompute-block keeps only each layer's input residual
    // over the limit: the error names the flags that make it fit, found from the same plans
    auto over = run_command(base + " --memory-limit=20GiB");
    EXPECT_EQ(over.exit_code, 1) << over.output;
    EXPECT_TRUE(Contains(over.output, "it fits with --recompute-")) << over.output;
}

// The flags a plan-over-the-limit error suggests: what stands between "it fits with " and " (or", or
// "" when the output has no such suggestion.
std::string suggested_flags(const std::string& out) {
    const std::string head = "it fits with ";
    const std::size_t at = out.find(head);
    const std::size_t end = at == std::string::npos ? at : out.find(" (or", at);
    return end == std::string::npos ? std::string() : out.substr(at + head.size(), end - at - head.size());
}

// At long sequences cuDNN's deterministic attention backward keeps a dP workspace of B·Hq·T²·2 bytes
// (7B, seq 32768: ~60 GB): when recompute and the LM head's chunks are not enough, the ladder tries
// qtrain's flash kernels (no such workspace) on the same rung before it moves to host memory, and the
// suggestion it prints fits. With --attention=flash given already it never suggests it.
TEST(TrainCli, LongSequencesAreSuggestedTheFlashKernelsWhenCudnnsWorkspaceDoesNotFit) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "built without the CUDA backend";
#endif
    const std::string base = train_exe() +
                             " --device=cuda --model=Qwen2.5-7B --from-scratch --plan-only --seq-len=32768 --batch-size=1"
                             " --model-dtype=bf16 --opt-m-dtype=bf16 --opt-v-dtype=bf16 --matmul-dtype=e4m3"
                             " --gradient-dtype=e5m2 --memory-limit=130GiB";
    auto over = run_command(base);
    EXPECT_EQ(over.exit_code, 1) << over.output;
    const std::string flags = suggested_flags(over.output);
    ASSERT_FALSE(flags.empty()) << over.output;
    EXPECT_TRUE(Contains(flags, "--attention=flash")) << flags;
    EXPECT_TRUE(Contains(flags, "--recompute-block")) << flags;
    EXPECT_FALSE(Contains(flags, "--offload-master")) << "flash on the rung comes before more host memory: " << flags;
    auto fits = run_command(base + " " + flags);
    EXPECT_EQ(fits.exit_code, 0) << flags << "\n" << fits.output;
    auto given = run_command(base + " --attention=flash");
    EXPECT_EQ(given.exit_code, 1) << given.output;
    EXPECT_FALSE(Contains(given.output, "it fits with --attention=flash")) << given.output;
    EXPECT_TRUE(Contains(given.output, "it fits with ")) << given.output;
}

// A number from the [Allocator State] table: the device MiB of `category` (-1 when absent).
long plan_mib(const std::string& out, const std::string& category) {
    const auto pos = out.find("  " + category + " ");
    if (pos == std::string::npos) return -1;
    return std::stol(out.substr(pos + 2 + category.size()));
}

// --attn-bwd-chunks=N sizes the attention backward's workspace (flash kernels: delta, one fp32 per
// query row and head) for B/N sequences and changes nothing else in the plan; N must divide
// --batch-size.
TEST(TrainCli, GpuAttnBwdChunksShrinkTheWorkspaceAndMustDivideTheBatch) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "built without the CUDA backend";
#else
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    TrainOptions t;
    t.batch_size = 16;
    t.seq_len = 1024;
    t.attention = "flash";
    const ModelOptions one = t.model_options("cuda");
    const MemoryPlan base = plan_model(cfg, one, "cuda");
    const std::size_t row_bytes = static_cast<std::size_t>(cfg.num_attention_heads) * 1024 * sizeof(float);
    for (int n : {2, 4, 16}) {
        SCOPED_TRACE(cat("--attn-bwd-chunks=", n));
        ModelOptions o = one;
        o.attn_bwd_chunks = n;
        const MemoryPlan p = plan_model(cfg, o, "cuda");
        ASSERT_EQ(p.entries.size(), base.entries.size());
        for (std::size_t i = 0; i < p.entries.size(); ++i) {
            const auto &e = p.entries[i], &b = base.entries[i];
            EXPECT_EQ(e.pinned_bytes, b.pinned_bytes) << e.category;
            if (e.category == "Workspace")
                EXPECT_EQ(b.device_bytes - e.device_bytes, (16 - 16 / n) * row_bytes);  // 16 -> 16/n sequences
            else
                EXPECT_EQ(e.device_bytes, b.device_bytes) << e.category;
        }
    }
    ModelOptions bad = one;
    bad.attn_bwd_chunks = 3;
    EXPECT_ERROR(plan_model(cfg, bad, "cuda"), "--attn-bwd-chunks=3 must divide --batch-size=16");

    // through the program: --plan-only prints the smaller workspace; a non-divisor is a clear error
    const std::string cmd = train_exe() +
                            " --device=cuda --model=Qwen2.5-0.5B --from-scratch --plan-only --batch-size=16 "
                            "--seq-len=8192 --attention=flash";  // delta: 16 x 14 heads x 8192 x 4 bytes = 7 MiB
    auto full = run_command(cmd), chunked = run_command(cmd + " --attn-bwd-chunks=8");
    ASSERT_EQ(full.exit_code, 0) << full.output;
    ASSERT_EQ(chunked.exit_code, 0) << chunked.output;
    const long ws_full = plan_mib(full.output, "Workspace"), ws_chunked = plan_mib(chunked.output, "Workspace");
    ASSERT_GT(ws_full, 0) << full.output;
    EXPECT_NEAR(ws_full - ws_chunked, 6, 1) << full.output << chunked.output;  // 7 MiB -> 0.875 MiB
    EXPECT_EQ(plan_mib(chunked.output, "Activations"), plan_mib(full.output, "Activations"));
    auto r = run_command(cmd + " --attn-bwd-chunks=3");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Contains(r.output, "--attn-bwd-chunks=3 must divide --batch-size=16")) << r.output;
    EXPECT_FALSE(Contains(r.output, "internal error")) << r.output;
#endif
}

// The cuDNN backend's workspace (its deterministic backward keeps dP, B/N x Hq x T x T bf16) is in the
// plan too, and --attn-bwd-chunks shrinks it. Without a GPU the plan uses the estimate of
// attention_cudnn.h (checked against what cuDNN asks for by bench/attention_bench on the GPU).
TEST(TrainCli, GpuCudnnAttentionWorkspaceIsPlannedAndChunked) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "built without the CUDA backend";
#else
    if (!detail::cudnn_attention_compiled()) GTEST_SKIP() << "this build has no cuDNN attention backend";
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    TrainOptions t;
    t.batch_size = 16;
    t.seq_len = 1024;
    auto workspace = [&](const std::string& attention, int chunks) {
        TrainOptions o = t;
        o.attention = attention;
        o.attn_bwd_chunks = chunks;
        for (const auto& e : plan_model(cfg, o.model_options("cuda"), "cuda").entries)
            if (e.category == "Workspace") return e.device_bytes;
        ADD_FAILURE() << "no Workspace entry";
        return std::size_t{0};
    };
    const std::size_t flash = workspace("flash", 1), cudnn = workspace("cudnn", 1), cudnn4 = workspace("cudnn", 4);
    const std::size_t dp = std::size_t{16} * 14 * 1024 * 1024 * 2;  // dP of 16 sequences: 448 MiB
    EXPECT_GE(cudnn - flash, dp);
    EXPECT_LT(cudnn - flash, dp * 5 / 4);
    EXPECT_GE(cudnn - cudnn4, dp * 3 / 4);  // 16 -> 4 sequences at a time
    EXPECT_EQ(workspace("auto", 1), cudnn) << "auto picks cuDNN where the build has it";
    // cuDNN attention is bf16 only
    TrainOptions f32 = t;
    f32.attention = "cudnn";
    f32.model_dtype = "fp32";
    EXPECT_ERROR(plan_model(cfg, f32.model_options("cuda"), "cuda"), "--attention=cudnn needs --model-dtype=bf16");
#endif
}

// --fp8-fast-accum needs FP8 GEMMs (and `all` FP8 gradients); neither it nor --gemm-autotune (both
// cuBLASLt settings) means anything to the CPU reference model.
TEST(TrainCli, FastAccumulationAndAutotuneFlagsAreCheckedAgainstTheRest) {
    const ModelConfig cfg = preset_config("Qwen2.5-0.5B");
    TrainOptions t;
    t.batch_size = 4;
    t.seq_len = 256;
    TrainOptions cpu = t;
    cpu.fp8_fast_accum = "forward";
    EXPECT_ERROR(plan_model(cfg, cpu.model_options("cpu"), "cpu"), "--fp8-fast-accum is not supported on --device=cpu");
    cpu = t;
    cpu.gemm_autotune = true;
    EXPECT_ERROR(plan_model(cfg, cpu.model_options("cpu"), "cpu"), "--gemm-autotune is not supported on --device=cpu");
#ifdef QTRAIN_HAVE_CUDA
    TrainOptions g = t;
    g.fp8_fast_accum = "forward";
    EXPECT_ERROR(plan_model(cfg, g.model_options("cuda"), "cuda"), "--fp8-fast-accum applies to FP8 GEMMs");
    g.matmul_dtype = "e4m3";
    EXPECT_NO_THROW(plan_model(cfg, g.model_options("cuda"), "cuda"));
    g.fp8_fast_accum = "all";  // the backward GEMMs are bf16 with the default gradient dtype
    EXPECT_ERROR(plan_model(cfg, g.model_options("cuda"), "cuda"), "--fp8-fast-accum=all also covers the backward");
    g.gradient_dtype = "e5m2";
    g.gemm_autotune = true;
    EXPECT_NO_THROW(plan_model(cfg, g.model_options("cuda"), "cuda"));
#endif
}

TEST(TrainCli, BadInputsGiveClearErrors) {
    Fixture f;
    struct Case {
        std::string args, expect;
    };
    const std::string exe = train_exe();
    std::vector<Case> cases = {
        {f.base_cmd("x") + " --train-file=" + (f.dir / "nope*.bin"), "--train-file: no file matches"},
        {f.base_cmd("x") + " --model-dtype=fp64", "--model-dtype"},
        {f.base_cmd("x") + " --model-dtype=bf16", "not supported yet"},
        {f.base_cmd("x") + " --recompute-ffn", "--recompute"},
        {f.base_cmd("x") + " --batch-size=0", "--batch-size"},
        {exe + " --device=cpu --model=Qwen2.5-0.5B --train-file=" + f.train_file, "--from-scratch"},
        {exe + " --device=cpu --model=" + (f.dir / "no-such-model") + " --from-scratch --train-file=" + f.train_file,
         "cannot find model"},
        {exe + " --device=cpu --model=" + f.model_dir + " --seq-len=64 --train-file=" + f.train_file, "model.safetensors"},
        {f.base_cmd("x") + " --no-such-flag", "no-such-flag"},
    };
    for (const auto& c : cases) {
        auto r = run_command(c.args + " --steps=1");
        EXPECT_NE(r.exit_code, 0) << c.args;
        EXPECT_TRUE(Contains(r.output, c.expect)) << c.args;
        EXPECT_FALSE(Contains(r.output, "internal error")) << c.args;
    }
}

TEST(TrainCli, TokenFileFromALargerVocabIsRejected) {
    Fixture f;
    std::vector<int32_t> tok(1000, 5);
    tok[500] = 100;  // >= vocab 64
    write_token_file(f.dir / "big.bin", tok, 128);
    auto r = run_command(f.base_cmd("x") + " --steps=1 --train-file=" + (f.dir / "big.bin"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Contains(r.output, "big.bin"));
}

TEST(TrainCli, EveryFlagInHelpIsDocumentedInTheReadme) {
    auto r = run_command(train_exe() + " --help");
    ASSERT_EQ(r.exit_code, 0);
    const std::string readme = read_file(std::string(QTRAIN_SOURCE_DIR) + "/README.md");
    std::regex flag(R"(--[a-z][a-z0-9-]+)");
    std::set<std::string> flags;
    for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), flag); it != std::sregex_iterator(); ++it)
        flags.insert(it->str());
    EXPECT_GT(flags.size(), 50u);
    for (const auto& fl : flags) EXPECT_TRUE(Contains(readme, "`" + fl)) << "README.md does not document " << fl;
}

// On several GPUs the ladder of flags that make a plan fit shards over the ranks (ZeRO-2, then ZeRO-3)
// before it offloads anything; the suggestion works as given, and the plan note says what ZeRO-3 shards.
TEST(TrainCli, GpuPlanOnSeveralRanksNamesZeroThreeBeforeOffloading) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "built without the CUDA backend";
#endif
    const std::string base = train_exe() +
                             " --device=cuda --model=Qwen2.5-7B --from-scratch --plan-only --batch-size=4"
                             " --gpus=8 --opt-m-dtype=bf16 --opt-v-dtype=bf16 --memory-limit=24GiB";
    auto over = run_command(base);
    EXPECT_EQ(over.exit_code, 1) << over.output;
    const std::string flags = suggested_flags(over.output);
    ASSERT_FALSE(flags.empty()) << over.output;
    // sharding first: ZeRO-3, then (the non-layer weights and gradients stay whole on every rank) offloads
    EXPECT_EQ(flags.rfind("--recompute-block --zero-level=3", 0), 0u) << flags;
    auto fits = run_command(base + " " + flags);
    EXPECT_EQ(fits.exit_code, 0) << fits.output;
    EXPECT_TRUE(Contains(fits.output, "ZeRO-3: the master weights, Adam's moments, the gradients and the weights are "
                                      "one rank's block, 1/8 of them"))
        << fits.output;
    // on one GPU the same model needs the host: the one-GPU ladder, which streams the weights
    auto one = run_command(train_exe() + " --device=cuda --model=Qwen2.5-7B --from-scratch --plan-only --batch-size=4"
                           " --opt-m-dtype=bf16 --opt-v-dtype=bf16 --memory-limit=24GiB");
    EXPECT_EQ(one.exit_code, 1) << one.output;
    EXPECT_FALSE(Contains(one.output, "--zero-level")) << one.output;
}
