// LoRA through the `train` program on the GPU (issue 33; the CPU tests are tests/train/
// train_cli_lora_test.cpp): a run writes PEFT's adapter into --out-dir, --continue from adapter-only
// checkpoints reproduces the uninterrupted run bit for bit (eager and with CUDA graphs), what the
// GPU does not do yet with LoRA is refused naming the flag, and `--export-checkpoint --merge-lora`
// of its checkpoint equals the run's merged export.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "gpu_test_util.h"
#include "io/safetensors.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;
namespace fs = std::filesystem;

TEST(TrainCliLoraGpu, OutDirHoldsAPeftAdapter) {
    QTRAIN_REQUIRE_GPU();
    Fixture f(kGpuShape);
    auto r = run_command(f.base_cmd("run", "cuda") + " --steps=3 --eval-every-n-steps=0 --lora-rank=8 --lora-alpha=16");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const fs::path out = f.dir / "run";
    EXPECT_FALSE(fs::exists(out / "model.safetensors"));
    const auto cfg = nlohmann::json::parse(read_file(out / "adapter_config.json"));
    EXPECT_EQ(cfg["peft_type"], "LORA");
    EXPECT_EQ(cfg["r"], 8);
    EXPECT_EQ(cfg["lora_alpha"], 16);
    SafeTensorsReader adapter({out / "adapter_model.safetensors"});
    EXPECT_EQ(adapter.names().size(), 2u * 7u * 2u);  // 2 layers, 7 targets, A and B
    // hidden 128, 2 kv heads of 64, intermediate 96
    EXPECT_EQ(adapter.info("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight").shape,
              (std::vector<int64_t>{128, 8}));
    EXPECT_EQ(adapter.info("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight").shape,
              (std::vector<int64_t>{8, 96}));
    // B starts at zero and trained away from it
    const Tensor b = adapter.view("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
    std::vector<float> v(b.numel());
    adapter.read_f32("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", {128, 8}, v.data());
    double b_max = 0;
    for (float x : v) b_max = std::max(b_max, std::abs(static_cast<double>(x)));
    EXPECT_GT(b_max, 0.0);
}

// --continue from checkpoints that hold the adapters only (the merged exports compared bit for bit).
TEST(TrainCliLoraGpu, ContinueIsBitExactFromAdapterOnlyCheckpoints) {
    QTRAIN_REQUIRE_GPU();
    for (const char* extra : {" --lora-rank=8 --lora-alpha=16 --lora-dropout=0.2 --merge-lora",
                              " --lora-rank=8 --lora-targets=q,v,down --lora-dropout=0.1 --merge-lora --use-cuda-graphs"
                              " --recompute-block",
                              // the FP8 base (the base's e4m3 copies made again from --model on resume)
                              " --lora-rank=8 --lora-dropout=0.1 --merge-lora --matmul-dtype=e4m3 --gradient-dtype=e5m2"
                              " --use-cuda-graphs"}) {
        SCOPED_TRACE(extra);
        Fixture f(kGpuShape);
        expect_continue_reproduces_full_run(f, "cuda", extra);
        const fs::path ckpt = f.dir / "part-ckpt/step_00000005";
        EXPECT_TRUE(fs::exists(ckpt / "adapter_model.safetensors"));
        EXPECT_TRUE(fs::exists(ckpt / "optimizer.safetensors"));
        EXPECT_FALSE(fs::exists(ckpt / "model.safetensors"));
    }
}

// The base streamed from host memory (--shard-weights, one GPU; the FP8 base's e4m3 codes, or the bf16
// base) trains as the resident base: the same step and eval losses and the same adapter bytes
// (recompute, dropout, two micro-batches a step), and --continue from the streamed FP8 base's
// adapter-only checkpoints reproduces its uninterrupted run.
TEST(TrainCliLoraGpu, StreamedBaseTrainsAsTheResidentOne) {
    QTRAIN_REQUIRE_GPU();
    for (const char* base : {" --matmul-dtype=e4m3 --gradient-dtype=e5m2", ""}) {
        SCOPED_TRACE(base);
        const std::string run =
            std::string(" --steps=4 --eval-every-n-steps=2 --lora-rank=8 --lora-dropout=0.1 --recompute-block") + base;
        Fixture f(kGpuShape);
        auto resident = run_command(f.base_cmd("resident", "cuda") + run + " --log-file=" + (f.dir / "resident.jsonl"));
        ASSERT_EQ(resident.exit_code, 0) << resident.output;
        auto streamed = run_command(f.base_cmd("streamed", "cuda") + run + " --shard-weights --log-file=" +
                                    (f.dir / "streamed.jsonl"));
        ASSERT_EQ(streamed.exit_code, 0) << streamed.output;
        const std::vector<double> losses = step_losses(f.dir / "streamed.jsonl");
        EXPECT_EQ(losses.size(), 4u);
        EXPECT_EQ(losses, step_losses(f.dir / "resident.jsonl"));
        const std::vector<double> evals = event_values(f.dir / "streamed.jsonl", "eval", "loss");
        EXPECT_FALSE(evals.empty());
        EXPECT_EQ(evals, event_values(f.dir / "resident.jsonl", "eval", "loss"));
        EXPECT_EQ(read_file(fs::path(f.dir / "streamed") / "adapter_model.safetensors"),
                  read_file(fs::path(f.dir / "resident") / "adapter_model.safetensors"));
    }
    Fixture f(kGpuShape);
    expect_continue_reproduces_full_run(f, "cuda",
                                        " --lora-rank=8 --lora-dropout=0.1 --merge-lora --matmul-dtype=e4m3"
                                        " --gradient-dtype=e5m2 --shard-weights");
}

TEST(TrainCliLoraGpu, RefusesWhatIsNotWrittenYetNamingTheFlag) {
    QTRAIN_REQUIRE_GPU();
    Fixture f(kGpuShape);
    const std::string lora = " --steps=2 --lora-rank=8";
    // (--train-also with the streamed bf16 base on one GPU runs since session 24)
    const RunResult also = run_command(f.base_cmd("stream", "cuda") + lora + " --shard-weights --train-also=norms");
    EXPECT_EQ(also.exit_code, 0) << also.output;
    expect_refused(run_command(f.base_cmd("offload", "cuda") + lora + " --offload-opt-m"), "--offload-opt-m");
    // (a trained FP8 LM head runs since session 24: CudaLoraTrainAlso.Fp8HeadIsQuantisedAgainAfterEachUpdate)
    const RunResult head = run_command(f.base_cmd("also", "cuda") + lora +
                                           " --train-also=embeddings --matmul-dtype=e4m3 --gradient-dtype=e5m2"
                                           " --lm-head-dtype=e4m3");
    EXPECT_EQ(head.exit_code, 0) << head.output;
}

// --train-also on the GPU: the adapter names the trained norms and embeddings as the CPU model's run
// does (modules_to_save), --continue is bit-exact (bf16 with dropout, CUDA graphs and recompute; two
// ranks on one GPU), and `--export-checkpoint --merge-lora` equals the run's merged export.
TEST(TrainCliLoraGpu, TrainAlsoWritesTheCpusAdapterAndContinuesBitExactly) {
    QTRAIN_REQUIRE_GPU();
    const std::string also = " --lora-rank=8 --lora-targets=q,v --train-also=norms,embeddings";
    {
        Fixture f(kGpuShape);
        const std::string run = " --steps=2 --eval-every-n-steps=0" + also;
        auto g = run_command(f.base_cmd("gpu", "cuda") + run);
        auto c = run_command(f.base_cmd("cpu", "cpu") + run);
        ASSERT_EQ(g.exit_code, 0) << g.output;
        ASSERT_EQ(c.exit_code, 0) << c.output;
        SafeTensorsReader ga({f.dir / "gpu/adapter_model.safetensors"}), ca({f.dir / "cpu/adapter_model.safetensors"});
        auto gn = ga.names(), cn = ca.names();
        EXPECT_EQ(std::set<std::string>(gn.begin(), gn.end()), std::set<std::string>(cn.begin(), cn.end()));
        EXPECT_TRUE(ga.has("base_model.model.model.norm.weight"));
        EXPECT_TRUE(ga.has("base_model.model.model.embed_tokens.weight"));
        EXPECT_EQ(read_file(f.dir / "gpu/adapter_config.json"), read_file(f.dir / "cpu/adapter_config.json"));
    }
    const std::string limit = "timeout 300 ", two = " --gpus=2 --gpu-ids=0,0 --memcpy-all-gather";
    for (const std::string extra : {std::string(" --lora-dropout=0.1 --merge-lora --use-cuda-graphs --recompute-block"),
                                    two + " --lora-dropout=0.2 --merge-lora"}) {
        SCOPED_TRACE(extra);
        Fixture f(kGpuShape);
        expect_continue_reproduces_full_run(f, "cuda", also + extra, limit);
        SafeTensorsReader opt({f.dir / "part-ckpt/step_00000005/optimizer.safetensors"});
        EXPECT_TRUE(opt.has("base_model.model.model.norm.weight.exp_avg"));
    }
    {  // `--export-checkpoint --merge-lora` of its checkpoint = the run's own merged export, trained tensors included
        Fixture f(kGpuShape);
        ASSERT_EQ(run_command(f.base_cmd("base", "cuda") + " --steps=0 --eval-every-n-steps=0").exit_code, 0);
        const std::string base = f.dir / "base";
        std::string cmd = f.base_cmd("merged", "cuda");
        const std::string scratch = " --model=" + f.model_dir + " --from-scratch";
        ASSERT_NE(cmd.find(scratch), std::string::npos);
        cmd.replace(cmd.find(scratch), scratch.size(), " --model=" + base);
        auto run = run_command(cmd + " --steps=6 --eval-every-n-steps=0" + also + " --ckpt-interval=3 --merge-lora");
        ASSERT_EQ(run.exit_code, 0) << run.output;
        const fs::path ckpt = fs::path(f.dir / "merged-ckpt/step_00000006");
        auto ex = run_command(train_exe() + " --export-checkpoint=" + ckpt.string() + " --merge-lora --out-dir=" +
                              (f.dir / "exported") + " --model=" + base);
        ASSERT_EQ(ex.exit_code, 0) << ex.output;
        EXPECT_EQ(read_file(fs::path(f.dir / "exported") / "model.safetensors"),
                  read_file(fs::path(f.dir / "merged") / "model.safetensors"));
    }
}

// `--export-checkpoint --merge-lora` of a GPU LoRA run's checkpoint (done on the host, from --model's
// file): byte for byte the run's own --merge-lora export (bf16: the base rounded as the GPU model
// loads it, the merge in fp32, rounded once). Bases: an fp32 file (the CPU model's export, which the
// GPU rounds on load) and a bf16 one (the GPU model's).
TEST(TrainCliLoraGpu, ExportCheckpointMergeLoraEqualsTheRunsMergedExport) {
    QTRAIN_REQUIRE_GPU();
    for (const char* base_device : {"cpu", "cuda"}) {
        SCOPED_TRACE(base_device);
        Fixture f(kGpuShape);
        ASSERT_EQ(run_command(f.base_cmd("base", base_device) + " --steps=0 --eval-every-n-steps=0").exit_code, 0);
        const std::string base = f.dir / "base";
        std::string cmd = f.base_cmd("merged", "cuda");
        const std::string scratch = " --model=" + f.model_dir + " --from-scratch";
        ASSERT_NE(cmd.find(scratch), std::string::npos);
        cmd.replace(cmd.find(scratch), scratch.size(), " --model=" + base);
        auto run = run_command(cmd + " --steps=6 --eval-every-n-steps=0 --lora-rank=8 --lora-alpha=16 "
                                     "--lora-targets=q,v,up,down --ckpt-interval=3 --merge-lora");
        ASSERT_EQ(run.exit_code, 0) << run.output;
        const fs::path ckpt = fs::path(f.dir / "merged-ckpt/step_00000006");
        auto ex = run_command(train_exe() + " --export-checkpoint=" + ckpt.string() + " --merge-lora --out-dir=" +
                              (f.dir / "exported") + " --model=" + base);
        ASSERT_EQ(ex.exit_code, 0) << ex.output;
        for (const char* file : {"model.safetensors", "config.json"})
            EXPECT_EQ(read_file(fs::path(f.dir / "exported") / file), read_file(fs::path(f.dir / "merged") / file)) << file;
    }
}

// Two ranks on one GPU (--gpus=2 --gpu-ids=0,0 --memcpy-all-gather, the copy-engine communicator):
// the base replicated, each rank keeping its block of the adapters' optimizer state. Against one rank with twice
// the accumulation (dropout on: each rank draws the masks of the micro-batches it trains): the losses
// and the adapter (fp32 master of a bf16 run) within train_cli_data_parallel_test's bf16 bounds;
// --continue of the 2-rank run is bit-exact (eager, with CUDA graphs, and at ZeRO-3 with the merged
// export gathered from the ranks' blocks); ZeRO-2 and ZeRO-3 (the frozen base sharded: bf16 and the FP8
// base) give ZeRO-1's bits; ZeRO-3 with CUDA graphs is refused by name.
TEST(TrainCliLoraGpu, TwoRanksOnOneGpuEqualOneRankAndContinueBitExactly) {
    QTRAIN_REQUIRE_GPU();
    const std::string limit = "timeout 300 ", two = " --gpus=2 --gpu-ids=0,0 --memcpy-all-gather";
    const std::string lora = " --lora-rank=8 --lora-alpha=16 --lora-dropout=0.2 --adam-epsilon=1e-2";
    {
        Fixture f(kGpuShape);
        const std::string common = " --steps=8 --eval-every-n-steps=0" + lora;
        auto one = run_command(limit + f.base_cmd("one", "cuda") + common + " --grad-accumulation=4");
        auto many = run_command(limit + f.base_cmd("many", "cuda") + common + two + " --grad-accumulation=2");
        ASSERT_EQ(one.exit_code, 0) << one.output;
        ASSERT_EQ(many.exit_code, 0) << many.output;
        EXPECT_TRUE(Contains(many.output, "2 GPU ranks, ZeRO-1")) << many.output;
        const auto l1 = step_losses(f.dir / "one/log.jsonl"), l2 = step_losses(f.dir / "many/log.jsonl");
        ASSERT_EQ(l1.size(), 8u);
        ASSERT_EQ(l2.size(), 8u);
        for (int s = 0; s < 8; ++s) EXPECT_NEAR(l2[s], l1[s], 2e-3 * l1[s]) << "step " << s;
        const double d = relative_weight_difference(read_all_weights(f.dir / "one/adapter_model.safetensors"),
                                                    read_all_weights(f.dir / "many/adapter_model.safetensors"));
        std::printf("[train lora dp] 2 ranks on one GPU vs 1 rank: adapter max rel diff %.2e\n", d);
        EXPECT_LT(d, 2e-2);  // train_cli_data_parallel_test's bound for a bf16 run
        EXPECT_EQ(read_file(f.dir / "one/adapter_config.json"), read_file(f.dir / "many/adapter_config.json"));
        // ZeRO-2 of the adapters, and ZeRO-3 (the frozen base sharded over the ranks, each layer gathered
        // as it is used): ZeRO-1's losses and exported adapter bit for bit
        for (const char* level : {"2", "3"}) {
            const std::string name = std::string("z") + level;
            auto z = run_command(limit + f.base_cmd(name, "cuda") + common + two + " --grad-accumulation=2 --zero-level=" +
                                 level);
            ASSERT_EQ(z.exit_code, 0) << z.output;
            EXPECT_EQ(step_losses(f.dir / (name + "/log.jsonl")), l2) << name;
            EXPECT_EQ(read_file(f.dir / (name + "/adapter_model.safetensors")),
                      read_file(f.dir / "many/adapter_model.safetensors"))
                << name;
        }
        // the FP8 base at ZeRO-3 (its e4m3 codes sharded and gathered): its ZeRO-1's bits
        const std::string fp8 = " --model-dtype=bf16 --matmul-dtype=e4m3 --gradient-dtype=e5m2";
        auto f1 = run_command(limit + f.base_cmd("f1", "cuda") + common + fp8 + two + " --grad-accumulation=2");
        auto f3 = run_command(limit + f.base_cmd("f3", "cuda") + common + fp8 + two + " --grad-accumulation=2 --zero-level=3");
        ASSERT_EQ(f1.exit_code, 0) << f1.output;
        ASSERT_EQ(f3.exit_code, 0) << f3.output;
        EXPECT_EQ(step_losses(f.dir / "f3/log.jsonl"), step_losses(f.dir / "f1/log.jsonl"));
        EXPECT_EQ(read_file(f.dir / "f3/adapter_model.safetensors"), read_file(f.dir / "f1/adapter_model.safetensors"));
        // CUDA graphs cannot capture ZeRO-3's gathers: refused by name
        expect_refused(run_command(limit + f.base_cmd("z3g", "cuda") + " --steps=1" + lora + two +
                                   " --zero-level=3 --use-cuda-graphs"),
                       "--use-cuda-graphs");
    }
    for (const char* extra : {"", " --use-cuda-graphs --recompute-block", " --zero-level=3 --recompute-block"}) {
        SCOPED_TRACE(extra);
        Fixture f(kGpuShape);
        expect_continue_reproduces_full_run(f, "cuda", two + lora + " --merge-lora" + extra, limit);
        EXPECT_TRUE(fs::exists(f.dir / "part-ckpt/step_00000005/adapter_model.safetensors"));
    }
}
