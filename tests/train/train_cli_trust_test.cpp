// `train` refuses what would silently lose work or change a run, before the work is spent (issue 17):
// empty and non-finite flag values, flags the device cannot use, unwritable outputs, a log that cannot
// be written, a --continue that would replace or alter another run, a diverging run, a CPU batch over
// the machine's RAM, and --plan-only on a machine without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <sstream>

#include "io/safetensors.h"
#include "test_util.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;
namespace fs = std::filesystem;

namespace {

int count_events(const std::string& log_path, const std::string& kind) {
    int n = 0;
    std::istringstream in(read_file(log_path));
    std::string line;
    while (std::getline(in, line)) n += nlohmann::json::parse(line)["log"] == kind;
    return n;
}

}  // namespace

// "--checkpoint-dir= --out-dir=mine" used to take "--out-dir=mine" as the checkpoint directory.
TEST(TrainCliTrust, AnEmptyFlagValueIsAnErrorNamingTheFlag) {
    Fixture f;
    const auto r = run_command("cd " + f.dir.str() + " && " + f.base_cmd("x") + " --steps=1 --checkpoint-dir= --out-dir=mine");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Contains(r.output, "--checkpoint-dir has an empty value")) << r.output;
    EXPECT_FALSE(fs::exists(f.dir / "mine")) << r.output;
    EXPECT_FALSE(fs::exists(f.dir / "--out-dir=mine")) << r.output;
    // an empty value given as its own argument is refused by validation
    expect_refused(run_command(f.base_cmd("x") + " --steps=1 --checkpoint-dir ''"), "--checkpoint-dir must not be empty");
}

TEST(TrainCliTrust, NonFiniteHyperParametersAreRefused) {
    Fixture f;
    for (const char* flag : {"--learning-rate=inf", "--learning-rate=nan", "--weight-decay=inf", "--grad-clip=inf",
                             "--adam-epsilon=inf", "--beta-1=nan"}) {
        const std::string name = std::string(flag).substr(0, std::string(flag).find('='));
        expect_refused(run_command(f.base_cmd("x") + " --steps=1 " + flag), name + " must be a finite number");
    }
}

TEST(TrainCliTrust, SeqLenBeyondTheModelsPositionsIsRefused) {
    Fixture f;  // max_position_embeddings 512
    const auto r = run_command(f.base_cmd("x") + " --steps=1 --seq-len=513");
    expect_refused(r, "--seq-len=513 is longer than the model's max_position_embeddings (512");
    EXPECT_EQ(run_command(f.base_cmd("y") + " --steps=1 --seq-len=512 --batch-size=1").exit_code, 0);
}

// GPU settings are refused on the CPU, each under the name the user gave (--recompute-block implies
// the other recompute flags, and the error used to blame --recompute-swiglu).
TEST(TrainCliTrust, GpuFlagsOnTheCpuAreRefusedUnderTheirOwnName) {
    Fixture f;
    for (const char* flag : {"--recompute-block", "--recompute-ffn", "--recompute-att", "--recompute-norm",
                             "--attention=cudnn", "--attention=flash", "--attn-bwd-chunks=2", "--use-cuda-graphs",
                             "--shard-weights"}) {
        const std::string name = std::string(flag).substr(0, std::string(flag).find('='));
        expect_refused(run_command(f.base_cmd("x") + " --steps=1 " + flag), name + " is not supported on --device=cpu");
    }
    // a ZeRO level reaches the model as the sharding it implies; the error names the level
    for (const char* level : {"2", "3"})
        expect_refused(run_command(f.base_cmd("x") + " --steps=1 --zero-level=" + level),
                       cat("--zero-level=", level, " on --device=cpu needs several ranks"));
}

TEST(TrainCliTrust, HelpShowsDefaultsAndWhatGpusDoesToday) {
    const auto r = run_command(train_exe() + " --help");
    ASSERT_EQ(r.exit_code, 0);
    for (const char* d : {"--seq-len INT=1024", "--batch-size,--batch INT=4", "--steps INT=1000",
                          "--learning-rate,--lr FLOAT=1e-05", "--checkpoint-dir TEXT=ckpt", "--out-dir TEXT=output",
                          "--grad-accumulation INT=4", "--opt-m-dtype TEXT=fp32"})
        EXPECT_TRUE(Contains(r.output, d)) << d;
    EXPECT_TRUE(Contains(r.output, "On the GPU: one rank per GPU (--gpu-ids) over NCCL")) << r.output;
    EXPECT_TRUE(Contains(r.output, "ZeRO-3 with --zero-level=3")) << r.output;
    EXPECT_TRUE(Contains(r.output, "May change: --steps")) << "--continue's help says what may change";
}

// An unwritable --out-dir used to fail with "internal error: filesystem error" after every step had run.
TEST(TrainCliTrust, UnwritableOutputPathsFailBeforeTraining) {
    Fixture f;
    write_file(f.dir / "a-file", "x");
    const std::string under_file = f.dir / "a-file/sub";
    expect_refused(run_command(f.base_cmd("x") + " --steps=2 --out-dir=" + under_file), "--out-dir: '" + under_file);
    expect_refused(run_command(f.base_cmd("x") + " --steps=2 --checkpoint-dir=" + under_file),
                   "--checkpoint-dir: '" + under_file);
    expect_refused(run_command(f.base_cmd("x") + " --steps=2 --log-file=" + under_file + "/log.jsonl"), "--log-file");
    EXPECT_FALSE(fs::exists(f.dir / "x")) << "nothing is created for a run that cannot finish";
    // a bare file name is a file in the working directory
    const auto bare = run_command("cd " + f.dir.str() + " && " + f.base_cmd("y") + " --steps=1 --log-file=bare.jsonl");
    EXPECT_EQ(bare.exit_code, 0) << bare.output;
    EXPECT_TRUE(fs::exists(f.dir / "bare.jsonl"));
}

// A log on a full disk used to stay empty while the run exited 0.
TEST(TrainCliTrust, AFailedLogWriteIsAnError) {
    if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
    Fixture f;
    expect_refused(run_command(f.base_cmd("x") + " --steps=2 --log-file=/dev/full"), "--log-file: writing '/dev/full' failed");
}

// A typo in --checkpoint-dir with --continue used to start from step 0 and truncate the run's log.
TEST(TrainCliTrust, ContinueWithoutACheckpointDoesNotReplaceAnotherRunsOutput) {
    Fixture f;
    ASSERT_EQ(run_command(f.base_cmd("run") + " --steps=4 --ckpt-interval=2").exit_code, 0);
    const std::string log = read_file(f.dir / "run/log.jsonl");
    const std::string typo = f.dir / "run-ckpt-typo";
    const auto r = run_command(f.base_cmd("run") + " --steps=8 --continue --checkpoint-dir=" + typo);
    expect_refused(r, "--continue: no complete checkpoint in --checkpoint-dir '" + typo + "'");
    EXPECT_TRUE(Contains(r.output, f.dir / "run/log.jsonl")) << r.output;
    EXPECT_TRUE(Contains(r.output, f.dir / "run/model.safetensors")) << r.output;
    EXPECT_TRUE(Contains(r.output, "--overwrite")) << r.output;
    EXPECT_EQ(read_file(f.dir / "run/log.jsonl"), log) << "the other run's log was touched";
    // asked for, it starts over
    const auto over = run_command(f.base_cmd("run") + " --steps=3 --continue --overwrite --checkpoint-dir=" + typo);
    EXPECT_EQ(over.exit_code, 0) << over.output;
    EXPECT_EQ(step_losses(f.dir / "run/log.jsonl").size(), 3u);
}

// A job that always passes --continue and dies before its first checkpoint restarts from step 0 in its
// own log (appending), which is not another run's output.
TEST(TrainCliTrust, ContinueBeforeTheFirstCheckpointRestartsTheSameRun) {
    Fixture f;
    ASSERT_EQ(run_command(f.base_cmd("run") + " --steps=3 --continue").exit_code, 0);
    fs::remove(f.dir / "run/model.safetensors");  // as if it had been killed before the export
    const auto again = run_command(f.base_cmd("run") + " --steps=3 --continue");
    EXPECT_EQ(again.exit_code, 0) << again.output;
    EXPECT_EQ(count_events(f.dir / "run/log.jsonl", "options"), 2) << "the log was not appended to";
    // finished, exported and without a checkpoint: its own output is not replaced silently either
    expect_refused(run_command(f.base_cmd("run") + " --steps=3 --continue"),
                   "the output of this same run, which finished without writing a checkpoint");
    // with another seed it is another run: refused
    fs::remove(f.dir / "run/model.safetensors");
    expect_refused(run_command(f.base_cmd("run") + " --steps=3 --continue --seed=9"), "another run's output");
}

// A fresh run into a --checkpoint-dir that holds another run's checkpoints would mix the two (and a
// later --continue would pick the other run's newest).
TEST(TrainCliTrust, AFreshRunDoesNotMixItsCheckpointsWithAnotherRuns) {
    Fixture f;
    ASSERT_EQ(run_command(f.base_cmd("a") + " --steps=6 --ckpt-interval=3").exit_code, 0);
    const std::string ckpt = f.dir / "a-ckpt";
    const auto r = run_command(f.base_cmd("b") + " --steps=2 --ckpt-interval=2 --checkpoint-dir=" + ckpt);
    expect_refused(r, "--checkpoint-dir '" + ckpt + "' holds checkpoints of another run");
    EXPECT_TRUE(fs::exists(ckpt + "/step_00000006/state.json"));
    const auto over = run_command(f.base_cmd("b") + " --steps=2 --ckpt-interval=2 --overwrite --checkpoint-dir=" + ckpt);
    ASSERT_EQ(over.exit_code, 0) << over.output;
    EXPECT_FALSE(fs::exists(ckpt + "/step_00000006")) << "--overwrite keeps the other run's checkpoints";
    EXPECT_TRUE(fs::exists(ckpt + "/step_00000002/state.json"));
}

// --continue used to resume whatever options it was given.
TEST(TrainCliTrust, ContinueRefusesOptionsThatChangeTheRunAndNamesEach) {
    Fixture f;
    ASSERT_EQ(run_command(f.base_cmd("run") + " --steps=4 --ckpt-interval=2").exit_code, 0);
    const auto r = run_command(f.base_cmd("run") + " --steps=8 --continue --batch-size=2 --seed=3 --learning-rate=5e-4");
    expect_refused(r, "--continue: this run differs from the one that wrote");
    for (const char* d : {"--batch-size: 4 in the checkpoint, 2 now", "--seed: 42 in the checkpoint, 3 now",
                          "--learning-rate: 0.001 in the checkpoint, 0.0005 now", "--force-resume"})
        EXPECT_TRUE(Contains(r.output, d)) << d << "\n" << r.output;
    EXPECT_FALSE(Contains(r.output, "--steps:")) << "--steps may change";

    // another model (here: another rope theta) is refused by its config, whatever its path
    const std::string other = f.dir / "other-model";
    fs::create_directories(other);
    std::string cfg = read_file(f.model_dir + "/config.json");
    cfg.replace(cfg.find("10000.0"), 7, "20000.0");
    write_file(other + "/config.json", cfg);
    expect_refused(run_command(f.base_cmd("run") + " --steps=8 --continue --model=" + other),
                   "model config.rope_theta: 10000");

    // extending the run is allowed and its meaning for the schedule said
    const auto ok = run_command(f.base_cmd("run") + " --steps=8 --continue --eval-every-n-steps=0");
    ASSERT_EQ(ok.exit_code, 0) << ok.output;
    EXPECT_TRUE(Contains(ok.output, "[Resume] --steps: 4 in the checkpoint, 8 now")) << ok.output;
    EXPECT_TRUE(Contains(ok.output, "schedule is recomputed over 8 steps")) << ok.output;

    // and --force-resume takes a change on purpose, saying so
    ASSERT_EQ(run_command(f.base_cmd("run2") + " --steps=4 --ckpt-interval=2").exit_code, 0);
    const auto forced = run_command(f.base_cmd("run2") + " --steps=6 --continue --force-resume --learning-rate=5e-4");
    ASSERT_EQ(forced.exit_code, 0) << forced.output;
    EXPECT_TRUE(Contains(forced.output, "[Resume] --force-resume: --learning-rate: 0.001 in the checkpoint, 0.0005 now"))
        << forced.output;
    EXPECT_EQ(count_events(f.dir / "run2/log.jsonl", "resume_changes"), 1);
}

// With --learning-rate=1e6 the first update saturates the model: the next step's gradient is exactly
// zero. That step used to be applied anyway (Adam's momentum carried the weights to 1e16), its
// checkpoints written, and the run failed only at a NaN two steps later.
TEST(TrainCliTrust, ABrokenStepStopsTheRunBeforeItsUpdateOrCheckpoint) {
    Fixture f;
    const auto r = run_command(f.base_cmd("run") + " --steps=6 --ckpt-interval=1 --eval-every-n-steps=0 --learning-rate=1e6");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Contains(r.output, "training stopped at step 1")) << r.output;
    EXPECT_TRUE(Contains(r.output, "no checkpoint was written from it")) << r.output;
    EXPECT_TRUE(Contains(r.output, "lower --learning-rate")) << r.output;
    EXPECT_FALSE(Contains(r.output, "internal error")) << r.output;
    EXPECT_TRUE(fs::exists(f.dir / "run-ckpt/step_00000001/state.json"));
    EXPECT_FALSE(fs::exists(f.dir / "run-ckpt/step_00000002")) << "a checkpoint was written after the broken step";
    EXPECT_EQ(count_events(f.dir / "run/log.jsonl", "stopped"), 1);
}

// NaN weights in a model directory are named when loaded, not found as a diverged loss later.
TEST(TrainCliTrust, NonFiniteLoadedWeightsNameTheTensor) {
    Fixture f;
    ASSERT_EQ(run_command(f.base_cmd("init") + " --steps=0").exit_code, 0);
    const std::string src = f.dir / "init/model.safetensors";
    const std::string bad_dir = f.dir / "bad-model";
    fs::create_directories(bad_dir);
    fs::copy_file(f.dir / "init/config.json", bad_dir + "/config.json");
    {
        SafeTensorsReader in({src});
        SafeTensorsWriter out;
        std::vector<std::vector<float>> keep;
        for (const auto& name : in.names()) {
            const Tensor t = in.view(name);
            const std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.ndim);
            keep.emplace_back(t.numel());
            in.read_f32(name, shape, keep.back().data());
            if (name == "model.layers.1.self_attn.o_proj.weight") keep.back()[5] = std::numeric_limits<float>::quiet_NaN();
            out.add_f32(name, shape, keep.back().data());
        }
        out.write(bad_dir + "/model.safetensors");
    }
    const std::string cmd = train_exe() + " --device=cpu --model=" + bad_dir + " --train-file=" + f.train_file +
                            " --out-dir=" + (f.dir / "out") + " --checkpoint-dir=" + (f.dir / "ck") +
                            " --batch-size=4 --seq-len=64 --steps=2";
    expect_refused(run_command(cmd), "tensor 'model.layers.1.self_attn.o_proj.weight' holds a non-finite value");
}

// --batch-size=100000 on the CPU used to be killed by the OOM killer.
TEST(TrainCliTrust, ACpuBatchOverTheMachinesRamIsAClearErrorNamingOneThatFits) {
    Fixture f;
    const auto r = run_command(train_exe() + " --device=cpu --model=Qwen2.5-0.5B --from-scratch --train-file=" +
                               f.train_file + " --out-dir=" + (f.dir / "o") + " --checkpoint-dir=" + (f.dir / "c") +
                               " --batch-size=100000 --seq-len=1024 --steps=1");
    expect_refused(r, "this machine can give the CPU model about");
    const std::string key = "with the current flags --batch-size=";
    const auto at = r.output.find(key);
    ASSERT_NE(at, std::string::npos) << r.output;
    const int fits = std::atoi(r.output.c_str() + at + key.size());
    EXPECT_GT(fits, 0);
    EXPECT_LT(fits, 100000);
}

// The README's example on a laptop used to plan the fp32 CPU model and answer that nothing fits.
TEST(TrainCliTrust, PlanOnlyWithoutADeviceOnAMachineWithoutAGpuPlansTheGpu) {
#ifndef QTRAIN_HAVE_CUDA
    GTEST_SKIP() << "built without the CUDA backend: it can only plan the CPU model";
#endif
    if (std::system("nvidia-smi -L >/dev/null 2>&1") == 0) GTEST_SKIP() << "this machine has a GPU";
    const auto r = run_command(train_exe() + " --model=Qwen2.5-3B --from-scratch --plan-only --batch-size=4 "
                                             "--memory-limit=24GiB --recompute-block --offload-opt-m --offload-opt-v "
                                             "--offload-master");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "[Allocator State] (cuda)")) << r.output;
    EXPECT_TRUE(Contains(r.output, "no GPU here; --plan-only plans for the GPU")) << r.output;
    const auto cpu = run_command(train_exe() + " --device=cpu --model=Qwen2.5-3B --from-scratch --plan-only --batch-size=4");
    EXPECT_TRUE(Contains(cpu.output, "[Allocator State] (cpu)")) << cpu.output;
}

// The same --train-file glob over other files is other data (another data order): refused too.
TEST(TrainCliTrust, ContinueRefusesOtherTrainingFilesBehindTheSameGlob) {
    Fixture f;
    ASSERT_EQ(run_command(f.base_cmd("run") + " --steps=4 --ckpt-interval=2").exit_code, 0);
    write_token_file(f.train_file, make_tokens(30000, 7), kVocab);  // re-tokenised: 30000 tokens, not 40000
    const auto r = run_command(f.base_cmd("run") + " --steps=6 --continue");
    expect_refused(r, "in its data");
    EXPECT_TRUE(Contains(r.output, f.train_file + " (40000 tokens)")) << r.output;
    EXPECT_TRUE(Contains(r.output, f.train_file + " (30000 tokens)")) << r.output;
    const auto forced = run_command(f.base_cmd("run") + " --steps=6 --continue --force-resume");
    EXPECT_EQ(forced.exit_code, 0) << forced.output;
}
