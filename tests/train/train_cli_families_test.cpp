// Every family of the architecture description through `train` on the CPU model (the GPU runs the
// same in tests/gpu): a Qwen3 model (q/k norms, head_dim not hidden / heads) and a Llama 3 model
// (no biases, llama3 RoPE) learn, resume bit for bit, shard over ranks (ZeRO-1 and ZeRO-3 with the
// same bits), reshard from 2 ranks to 1, and export a model that `train` loads again as the same
// family, with the tensors of that family.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "test_util.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;
namespace fs = std::filesystem;

namespace {

const std::string kLimit = "timeout 180 ";

struct Family {
    const char* name;
    const char* fields;
    const char* hf_class;
    const char* present;  // a tensor only this family has (or "" for none)
    const char* absent;   // a tensor it must not have
};

class TrainCliFamilies : public ::testing::TestWithParam<Family> {};

TEST_P(TrainCliFamilies, LearnShardReshardAndExport) {
    const Family& fam = GetParam();
    Fixture f(kCpuShape, fam.fields);
    const std::string common = " --steps=16 --eval-every-n-steps=8 --eval-num-steps=2 --ckpt-interval=8 --learning-rate=1e-2";
    auto z1 = run_command(kLimit + f.base_cmd("z1") + common + " --gpus=2 --zero-level=1");
    ASSERT_EQ(z1.exit_code, 0) << z1.output;
    auto z3 = run_command(kLimit + f.base_cmd("z3") + common + " --gpus=2 --zero-level=3");
    ASSERT_EQ(z3.exit_code, 0) << z3.output;
    const auto losses = step_losses(f.dir / "z1/log.jsonl");
    ASSERT_EQ(losses.size(), 16u);
    EXPECT_LT(losses.back(), losses.front() - 0.5) << "the model did not learn";
    EXPECT_EQ(step_losses(f.dir / "z3/log.jsonl"), losses);
    EXPECT_EQ(read_file(f.dir / "z3/model.safetensors"), read_file(f.dir / "z1/model.safetensors"));

    // the 2-rank checkpoint of step 8 on 1 rank with twice the micro-batches: the same steps to rounding
    fs::copy(f.dir / "z1-ckpt", f.dir / "one-ckpt", fs::copy_options::recursive);
    fs::remove_all(f.dir / "one-ckpt/step_00000016");
    auto one = run_command(kLimit + f.base_cmd("one") + common + " --continue --gpus=1 --grad-accumulation=4");
    ASSERT_EQ(one.exit_code, 0) << one.output;
    int first = -1;
    const auto resumed = step_losses(f.dir / "one/log.jsonl", &first);
    EXPECT_EQ(first, 8);
    ASSERT_EQ(resumed.size(), 8u);
    for (int i = 0; i < 8; ++i) EXPECT_NEAR(resumed[i], losses[8 + i], 1e-6 * losses[8 + i]) << "step " << 8 + i;

    // the export: the family's config.json and tensors, loaded again by `train`
    const auto cfg = nlohmann::json::parse(read_file(f.dir / "z1/config.json"));
    EXPECT_EQ(cfg["architectures"][0], fam.hf_class);
    SafeTensorsReader st({f.dir / "z1/model.safetensors"});
    const auto names = st.names();
    auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
    if (*fam.present) EXPECT_TRUE(has(fam.present)) << fam.present;
    EXPECT_FALSE(has(fam.absent)) << fam.absent;
    auto again = run_command(kLimit + train_exe() + " --device=cpu --model=" + (f.dir / "z1") + " --train-file=" +
                             f.train_file + " --out-dir=" + (f.dir / "again") + " --checkpoint-dir=" +
                             (f.dir / "again-ckpt") + " --batch-size=4 --seq-len=64 --steps=1 --eval-every-n-steps=0");
    ASSERT_EQ(again.exit_code, 0) << again.output;
    const auto first_again = step_losses(f.dir / "again/log.jsonl");
    ASSERT_EQ(first_again.size(), 1u);
    EXPECT_LT(first_again[0], losses.front() - 0.5) << "the exported model did not keep what it learned";
}

INSTANTIATE_TEST_SUITE_P(
    Families, TrainCliFamilies,
    ::testing::Values(Family{"qwen3", kQwen3Family, "Qwen3ForCausalLM", "model.layers.1.self_attn.k_norm.weight",
                             "model.layers.0.self_attn.q_proj.bias"},
                      Family{"llama", kLlamaFamily, "LlamaForCausalLM", "", "model.layers.0.self_attn.q_proj.bias"}),
    [](const ::testing::TestParamInfo<Family>& i) { return std::string(i.param.name); });

// A family or setting qtrain does not implement stops before any work, naming the field.
TEST(TrainCliFamiliesRefused, UnsupportedArchitectureAndRopeType) {
    Fixture mistral(kCpuShape, R"("architectures": ["MistralForCausalLM"], "model_type": "mistral")");
    expect_refused(run_command(mistral.base_cmd("m") + " --steps=1"), "MistralForCausalLM");
    Fixture yarn(kCpuShape, R"("architectures": ["LlamaForCausalLM"], "model_type": "llama",
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0})");
    expect_refused(run_command(yarn.base_cmd("y") + " --steps=1"), "'rope_scaling.rope_type' = 'yarn'");
}

}  // namespace
