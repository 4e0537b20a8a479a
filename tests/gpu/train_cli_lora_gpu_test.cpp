// LoRA through the `train` program on the GPU (issue 33; the CPU tests are tests/train/
// train_cli_lora_test.cpp): a run writes PEFT's adapter into --out-dir, --continue from adapter-only
// checkpoints reproduces the uninterrupted run bit for bit (eager and with CUDA graphs), and what the
// GPU does not do yet with LoRA is refused naming the flag.
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
                              " --recompute-block"}) {
        SCOPED_TRACE(extra);
        Fixture f(kGpuShape);
        expect_continue_reproduces_full_run(f, "cuda", extra);
        const fs::path ckpt = f.dir / "part-ckpt/step_00000005";
        EXPECT_TRUE(fs::exists(ckpt / "adapter_model.safetensors"));
        EXPECT_TRUE(fs::exists(ckpt / "optimizer.safetensors"));
        EXPECT_FALSE(fs::exists(ckpt / "model.safetensors"));
    }
}

TEST(TrainCliLoraGpu, RefusesWhatIsNotWrittenYetNamingTheFlag) {
    QTRAIN_REQUIRE_GPU();
    Fixture f(kGpuShape);
    const std::string lora = " --steps=2 --lora-rank=8";
    expect_refused(run_command(f.base_cmd("fp8", "cuda") + lora + " --matmul-dtype=e4m3"), "--matmul-dtype=e4m3");
    expect_refused(run_command(f.base_cmd("stream", "cuda") + lora + " --shard-weights"), "--shard-weights");
    expect_refused(run_command(f.base_cmd("offload", "cuda") + lora + " --offload-opt-m"), "--offload-opt-m");
}
