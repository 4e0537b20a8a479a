// LoRA through the `train` program on the CPU (issue 33): the PEFT adapter in --out-dir, the merged
// export, --lora-from and its refusals, and a bit-exact --continue from checkpoints that hold the
// adapters only.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "test_util.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;
namespace fs = std::filesystem;

namespace {

std::vector<float> tensor(const SafeTensorsReader& r, const std::string& name) {
    const Tensor t = r.view(name);
    std::vector<float> v(t.numel());
    r.read_f32(name, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim), v.data());
    return v;
}

std::string layer_name(int l, const std::string& module, const std::string& which) {
    return "base_model.model.model.layers." + std::to_string(l) + "." + module + "." + which + ".weight";
}

}  // namespace

TEST(TrainCliLora, OutDirHoldsAPeftAdapter) {
    Fixture f;
    auto r = run_command(f.base_cmd("run") + " --steps=3 --eval-every-n-steps=0 --lora-rank=4 --lora-targets=q,v,down");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const fs::path out = f.dir / "run";
    EXPECT_FALSE(fs::exists(out / "model.safetensors"));
    const auto cfg = nlohmann::json::parse(read_file(out / "adapter_config.json"));
    EXPECT_EQ(cfg["peft_type"], "LORA");
    EXPECT_EQ(cfg["task_type"], "CAUSAL_LM");
    EXPECT_EQ(cfg["r"], 4);
    EXPECT_EQ(cfg["lora_alpha"], 8);
    EXPECT_EQ(cfg["bias"], "none");
    EXPECT_EQ(cfg["base_model_name_or_path"], f.model_dir);
    EXPECT_EQ(cfg["target_modules"], (nlohmann::json{"q_proj", "v_proj", "down_proj"}));
    SafeTensorsReader adapter({out / "adapter_model.safetensors"});
    std::set<std::string> expected;
    for (int l = 0; l < 2; ++l)
        for (const char* m : {"self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"})
            for (const char* w : {"lora_A", "lora_B"}) expected.insert(layer_name(l, m, w));
    const auto names = adapter.names();
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected);
    // hidden 32, kv 2 heads x 8, intermediate 64: A [r, in], B [out, r]
    EXPECT_EQ(adapter.info(layer_name(1, "self_attn.v_proj", "lora_A")).shape, (std::vector<int64_t>{4, 32}));
    EXPECT_EQ(adapter.info(layer_name(1, "self_attn.v_proj", "lora_B")).shape, (std::vector<int64_t>{16, 4}));
    EXPECT_EQ(adapter.info(layer_name(0, "mlp.down_proj", "lora_A")).shape, (std::vector<int64_t>{4, 64}));
    // another run into the same --out-dir (its log elsewhere) is refused: the adapter is that run's output
    auto again = run_command(f.base_cmd("run") + " --steps=3 --lora-rank=4 --log-file=" + (f.dir / "other.jsonl"));
    expect_refused(again, "adapter_model.safetensors");
    // B starts at zero and trained away from it
    double b_max = 0;
    for (float v : tensor(adapter, layer_name(0, "self_attn.q_proj", "lora_B"))) b_max = std::max(b_max, std::abs(double(v)));
    EXPECT_GT(b_max, 0.0);
}

// --merge-lora: the export is base + alpha/rank * B A (the base: the same seed's init, exported by a
// run of no steps without LoRA; the adapter: the same LoRA run without --merge-lora).
TEST(TrainCliLora, MergedExportIsTheBasePlusScaledBA) {
    Fixture f;
    const std::string lora = " --steps=3 --eval-every-n-steps=0 --lora-rank=4 --lora-alpha=12";
    ASSERT_EQ(run_command(f.base_cmd("base") + " --steps=0 --eval-every-n-steps=0").exit_code, 0);
    auto a = run_command(f.base_cmd("adapter") + lora);
    ASSERT_EQ(a.exit_code, 0) << a.output;
    auto m = run_command(f.base_cmd("merged") + lora + " --merge-lora");
    ASSERT_EQ(m.exit_code, 0) << m.output;
    EXPECT_FALSE(fs::exists(f.dir / "merged/adapter_config.json"));
    SafeTensorsReader base({f.dir / "base/model.safetensors"}), merged({f.dir / "merged/model.safetensors"}),
        adapter({f.dir / "adapter/adapter_model.safetensors"});
    const float s = 12.0f / 4.0f;
    int checked = 0;
    for (const std::string& name : base.names()) {
        const std::vector<float> w0 = tensor(base, name), w1 = tensor(merged, name);
        ASSERT_EQ(w0.size(), w1.size()) << name;
        const std::string prefix = "model.layers.";
        const bool adapted = name.rfind(prefix, 0) == 0 && name.find("_proj.weight") != std::string::npos;
        if (!adapted) {
            EXPECT_EQ(w0, w1) << name << " is not adapted: the base's";
            continue;
        }
        const std::string module = name.substr(0, name.size() - std::string(".weight").size());
        const std::vector<float> A = tensor(adapter, "base_model.model." + module + ".lora_A.weight"),
                                 B = tensor(adapter, "base_model.model." + module + ".lora_B.weight");
        const auto shape = base.info(name).shape;
        const int64_t out = shape[0], in = shape[1], r = 4;
        for (int64_t o = 0; o < out; ++o)
            for (int64_t i = 0; i < in; ++i) {
                double delta = 0;
                for (int64_t k = 0; k < r; ++k) delta += static_cast<double>(B[o * r + k]) * A[k * in + i];
                ASSERT_NEAR(w1[o * in + i], w0[o * in + i] + s * delta, 1e-6) << name << "[" << o << "," << i << "]";
            }
        ++checked;
    }
    EXPECT_EQ(checked, 2 * 7);
}

// Checkpoints of a LoRA run hold the adapters and their moments only (no base weights), and
// --continue from one reproduces the uninterrupted run bit for bit (the merged exports compared).
TEST(TrainCliLora, ContinueIsBitExactFromAdapterOnlyCheckpoints) {
    Fixture f;
    // with dropout: the resumed run draws the masks the uninterrupted one drew
    expect_continue_reproduces_full_run(f, "cpu", " --lora-rank=4 --lora-alpha=16 --lora-dropout=0.2 --merge-lora");
    const fs::path ckpt = f.dir / "part-ckpt/step_00000005";
    EXPECT_TRUE(fs::exists(ckpt / "adapter_model.safetensors"));
    EXPECT_TRUE(fs::exists(ckpt / "optimizer.safetensors"));
    EXPECT_FALSE(fs::exists(ckpt / "model.safetensors"));
    SafeTensorsReader opt({(ckpt / "optimizer.safetensors").string()});
    for (const std::string& name : opt.names()) EXPECT_EQ(name.rfind("base_model.model.", 0), 0u) << name;

    // --export-checkpoint of a LoRA checkpoint: its PEFT adapter
    auto ex = run_command(train_exe() + " --export-checkpoint=" + ckpt.string() + " --out-dir=" + (f.dir / "exported"));
    ASSERT_EQ(ex.exit_code, 0) << ex.output;
    EXPECT_EQ(read_file(f.dir / "exported/adapter_model.safetensors"), read_file(ckpt / "adapter_model.safetensors"));
    EXPECT_EQ(nlohmann::json::parse(read_file(f.dir / "exported/adapter_config.json"))["r"], 4);
}

// `--export-checkpoint --merge-lora` of a LoRA run's last checkpoint: --model's base with the adapters
// merged in, byte for byte what the end of the same `--merge-lora` run wrote (one merge, one writer).
// Refused: no --model, a --model of another shape, --merge-lora on a full run's checkpoint.
TEST(TrainCliLora, ExportCheckpointMergeLoraEqualsTheRunsMergedExport) {
    Fixture f;
    // a base with weights of its own (the seed's init, exported by a run of no steps)
    ASSERT_EQ(run_command(f.base_cmd("base") + " --steps=0 --eval-every-n-steps=0").exit_code, 0);
    const std::string base = f.dir / "base";
    std::string cmd = f.base_cmd("merged");
    const std::string scratch = " --model=" + f.model_dir + " --from-scratch";
    ASSERT_NE(cmd.find(scratch), std::string::npos);
    cmd.replace(cmd.find(scratch), scratch.size(), " --model=" + base);
    auto run = run_command(cmd + " --steps=6 --eval-every-n-steps=0 --lora-rank=4 --lora-alpha=12 "
                                 "--lora-targets=q,v,up,down --lora-dropout=0.1 --ckpt-interval=3 --merge-lora "
                                 "--train-also=norms");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const fs::path ckpt = fs::path(f.dir / "merged-ckpt/step_00000006");
    ASSERT_TRUE(fs::exists(ckpt / "adapter_model.safetensors"));
    const std::string export_cmd = train_exe() + " --export-checkpoint=" + ckpt.string() + " --merge-lora --out-dir=";
    auto ex = run_command(export_cmd + (f.dir / "exported") + " --model=" + base);
    ASSERT_EQ(ex.exit_code, 0) << ex.output;
    EXPECT_TRUE(Contains(ex.output, "merged into")) << ex.output;
    EXPECT_FALSE(fs::exists(f.dir / "exported/adapter_model.safetensors"));
    for (const char* file : {"model.safetensors", "config.json"})
        EXPECT_EQ(read_file(fs::path(f.dir / "exported") / file), read_file(fs::path(f.dir / "merged") / file)) << file;
    // the merge changed the adapted weights (B trained away from zero), not the others
    SafeTensorsReader b({f.dir / "base/model.safetensors"}), m({f.dir / "exported/model.safetensors"});
    EXPECT_NE(tensor(b, "model.layers.1.mlp.up_proj.weight"), tensor(m, "model.layers.1.mlp.up_proj.weight"));
    EXPECT_EQ(tensor(b, "model.layers.1.self_attn.k_proj.weight"), tensor(m, "model.layers.1.self_attn.k_proj.weight"));
    // --train-also=norms: the trained norms replace the base's
    EXPECT_NE(tensor(b, "model.norm.weight"), tensor(m, "model.norm.weight"));

    auto no_model = run_command(export_cmd + (f.dir / "x1"));
    EXPECT_EQ(no_model.exit_code, 1) << no_model.output;
    EXPECT_TRUE(Contains(no_model.output, "give the base model with --model")) << no_model.output;
    Fixture other(kCpuShape, kQwen3Family);
    ASSERT_EQ(run_command(other.base_cmd("base") + " --steps=0 --eval-every-n-steps=0").exit_code, 0);
    auto wrong = run_command(export_cmd + (f.dir / "x2") + " --model=" + (other.dir / "base"));
    EXPECT_EQ(wrong.exit_code, 1) << wrong.output;
    EXPECT_TRUE(Contains(wrong.output, "is not the base of the checkpoint")) << wrong.output;
    EXPECT_FALSE(fs::exists(f.dir / "x2/model.safetensors"));
    ASSERT_EQ(run_command(f.base_cmd("full") + " --steps=1 --eval-every-n-steps=0 --ckpt-interval=1").exit_code, 0);
    auto full = run_command(train_exe() + " --export-checkpoint=" + (f.dir / "full-ckpt/step_00000001") +
                            " --merge-lora --out-dir=" + (f.dir / "x3"));
    EXPECT_EQ(full.exit_code, 1) << full.output;
    EXPECT_TRUE(Contains(full.output, "checkpoint of a full training run")) << full.output;
}

// --lora-from starts from a saved adapter (a run of no steps exports it unchanged), and refuses one
// of another rank or another base, naming the flag.
TEST(TrainCliLora, LoraFromLoadsAnAdapterAndRefusesAnotherRankOrBase) {
    Fixture f;
    const std::string first = f.base_cmd("first") + " --steps=2 --eval-every-n-steps=0 --lora-rank=4";
    ASSERT_EQ(run_command(first).exit_code, 0);
    const std::string from = " --lora-from=" + (f.dir / "first");
    auto again = run_command(f.base_cmd("again") + " --steps=0 --eval-every-n-steps=0 --lora-rank=4" + from);
    ASSERT_EQ(again.exit_code, 0) << again.output;
    EXPECT_EQ(read_file(f.dir / "first/adapter_model.safetensors"), read_file(f.dir / "again/adapter_model.safetensors"));

    expect_refused(run_command(f.base_cmd("rank") + " --steps=2 --lora-rank=8" + from), "the adapter has rank r=4");
    expect_refused(run_command(f.base_cmd("alpha") + " --steps=2 --lora-rank=4 --lora-alpha=16" + from),
                   "lora_alpha=8");
    expect_refused(run_command(f.base_cmd("targets") + " --steps=2 --lora-rank=4 --lora-targets=q" + from),
                   "--lora-targets=q,k,v,o,gate,up,down");
    Fixture other(kCpuShape, kQwen3Family);  // head_dim 12: q/k/v/o of other shapes
    auto base = run_command(other.base_cmd("base") + " --steps=2 --lora-rank=4" + from);
    expect_refused(base, "--lora-from=" + (f.dir / "first"));
    EXPECT_TRUE(Contains(base.output, "not an adapter of this base model")) << base.output;
    expect_refused(run_command(f.base_cmd("none") + " --steps=2" + from), "--lora-from needs --lora-rank > 0");
    expect_refused(run_command(f.base_cmd("merge") + " --steps=2 --merge-lora"), "--merge-lora needs --lora-rank > 0");
}

// Every family of the architecture description: Qwen3 (q/k norm, head_dim 12) and Llama 3 (llama3
// RoPE) train adapters whose shapes follow the family's, and resume bit for bit.
TEST(TrainCliLora, Qwen3AndLlamaTrainAdaptersAndResume) {
    for (const char* family : {kQwen3Family, kLlamaFamily}) {
        SCOPED_TRACE(family);
        Fixture f(kCpuShape, family);
        expect_continue_reproduces_full_run(f, "cpu", " --lora-rank=4 --lora-targets=q,k,o,up --merge-lora");
        auto r = run_command(f.base_cmd("adapter") + " --steps=2 --eval-every-n-steps=0 --lora-rank=4");
        ASSERT_EQ(r.exit_code, 0) << r.output;
        SafeTensorsReader adapter({f.dir / "adapter/adapter_model.safetensors"});
        const bool qwen3 = family == std::string(kQwen3Family);
        // q_proj: [heads x head_dim, hidden] = [4 x 12, 32] on Qwen3, [32, 32] on Llama
        EXPECT_EQ(adapter.info(layer_name(1, "self_attn.q_proj", "lora_B")).shape,
                  (std::vector<int64_t>{qwen3 ? 48 : 32, 4}));
        EXPECT_EQ(adapter.info(layer_name(1, "self_attn.o_proj", "lora_A")).shape,
                  (std::vector<int64_t>{4, qwen3 ? 48 : 32}));
        EXPECT_EQ(adapter.names().size(), 2u * 7u * 2u);
    }
}

// --train-also: the norms and embeddings / LM head trained in full, saved in the adapter as PEFT saves
// modules_to_save, counted by --plan-only, resumed bit for bit; refused without LoRA, with an unknown
// name, and from an adapter trained with another --train-also (the GPU model trains them too:
// LoraOptions.CudaPlanShowsTheTrainAlsoTensors, tests/gpu/cuda_lora_train_also_test.cpp).
TEST(TrainCliLora, TrainAlsoNormsAndEmbeddings) {
    Fixture f;
    const std::string lora = " --eval-every-n-steps=0 --lora-rank=4 --lora-targets=q,v";
    auto r = run_command(f.base_cmd("run") + " --steps=3" + lora + " --train-also=norms,embeddings");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    SafeTensorsReader adapter({f.dir / "run/adapter_model.safetensors"});
    const auto names = adapter.names();
    const std::set<std::string> got(names.begin(), names.end());
    std::set<std::string> expected = {"base_model.model.model.embed_tokens.weight", "base_model.model.lm_head.weight",
                                      "base_model.model.model.norm.weight"};
    for (int l = 0; l < 2; ++l) {
        for (const char* m : {"self_attn.q_proj", "self_attn.v_proj"})
            for (const char* w : {"lora_A", "lora_B"}) expected.insert(layer_name(l, m, w));
        for (const char* n : {"input_layernorm", "post_attention_layernorm"})
            expected.insert("base_model.model.model.layers." + std::to_string(l) + "." + n + ".weight");
    }
    EXPECT_EQ(got, expected);
    EXPECT_EQ(adapter.info("base_model.model.lm_head.weight").shape, (std::vector<int64_t>{64, 32}));
    const auto cfg = nlohmann::json::parse(read_file(f.dir / "run/adapter_config.json"));
    EXPECT_EQ(cfg["modules_to_save"],
              (nlohmann::json{"input_layernorm", "post_attention_layernorm", "norm", "embed_tokens", "lm_head"}));
    EXPECT_FALSE(cfg.contains("ensure_weight_tying"));  // untied

    // --plan-only takes the flag (the counts: CpuLoraTrainAlso.MemoryPlanCountsTheTrainedTensors)
    auto plan = run_command(f.base_cmd("plan") + " --plan-only" + lora + " --train-also=norms,embeddings");
    EXPECT_EQ(plan.exit_code, 0) << plan.output;
    EXPECT_TRUE(Contains(plan.output, "LoRA adapters")) << plan.output;

    // --continue reproduces the uninterrupted run (losses and the merged export, trained norms included)
    expect_continue_reproduces_full_run(f, "cpu", " --lora-rank=4 --lora-dropout=0.1 --train-also=norms,embeddings --merge-lora");
    SafeTensorsReader opt({f.dir / "part-ckpt/step_00000005/optimizer.safetensors"});
    EXPECT_TRUE(opt.has("base_model.model.model.norm.weight.exp_avg"));
    EXPECT_TRUE(opt.has("base_model.model.lm_head.weight.exp_avg_sq"));

    expect_refused(run_command(f.base_cmd("x1") + " --steps=2 --train-also=norms"), "--train-also needs --lora-rank > 0");
    expect_refused(run_command(f.base_cmd("x2") + " --steps=2 --lora-rank=4 --train-also=norms,heads"),
                   "unknown entry 'heads'");
    // an adapter trained with --train-also=norms,embeddings continues only with the same
    expect_refused(run_command(f.base_cmd("x4") + " --steps=2" + lora + " --lora-from=" + (f.dir / "run")),
                   "(give --train-also=norms,embeddings)");
    auto from = run_command(f.base_cmd("again") + " --steps=0" + lora + " --train-also=norms,embeddings --lora-from=" +
                            (f.dir / "run"));
    ASSERT_EQ(from.exit_code, 0) << from.output;
    EXPECT_EQ(read_file(f.dir / "again/adapter_model.safetensors"), read_file(f.dir / "run/adapter_model.safetensors"));
}

// A tied model trains one matrix: the adapter holds embed_tokens only, and tells PEFT to tie the head to it.
TEST(TrainCliLora, TrainAlsoEmbeddingsOfATiedModel) {
    Fixture f;
    std::string config = read_file(f.model_dir + "/config.json");
    const std::string untied = R"("tie_word_embeddings": false)";
    ASSERT_NE(config.find(untied), std::string::npos);
    config.replace(config.find(untied), untied.size(), R"("tie_word_embeddings": true)");
    write_file(f.model_dir + "/config.json", config);
    auto r = run_command(f.base_cmd("run") + " --steps=2 --eval-every-n-steps=0 --lora-rank=4 --train-also=embeddings");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    SafeTensorsReader adapter({f.dir / "run/adapter_model.safetensors"});
    EXPECT_TRUE(adapter.has("base_model.model.model.embed_tokens.weight"));
    // PEFT's tied head (ensure_weight_tying) is a second wrapper whose load wants the matrix under its name
    // too: the same values
    EXPECT_EQ(tensor(adapter, "base_model.model.lm_head.weight"), tensor(adapter, "base_model.model.model.embed_tokens.weight"));
    // a checkpoint's adapter file is the same PEFT file, and the adapter continues with --lora-from
    auto again = run_command(f.base_cmd("again") + " --steps=1 --eval-every-n-steps=0 --lora-rank=4 --train-also=embeddings "
                             "--ckpt-interval=1 --lora-from=" + (f.dir / "run"));
    ASSERT_EQ(again.exit_code, 0) << again.output;
    SafeTensorsReader ckpt({f.dir / "again-ckpt/step_00000001/adapter_model.safetensors"});
    EXPECT_EQ(tensor(ckpt, "base_model.model.lm_head.weight"), tensor(ckpt, "base_model.model.model.embed_tokens.weight"));
    const auto cfg = nlohmann::json::parse(read_file(f.dir / "run/adapter_config.json"));
    EXPECT_EQ(cfg["modules_to_save"], (nlohmann::json{"embed_tokens"}));
    EXPECT_EQ(cfg["ensure_weight_tying"], true);
}
