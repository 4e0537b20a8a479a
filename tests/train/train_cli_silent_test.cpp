// `train` says what it would otherwise do silently (issue 29): a fresh run does not replace another
// run's model and log, token files with every target masked are refused before the work, negative
// seeds and timeouts are refused in plain words, a warmup longer than the run is said, and wrong
// paths are named for what they are (a directory as a file, a config.json that is a directory, a
// file as --model).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "io/token_file.h"
#include "test_util.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;
namespace fs = std::filesystem;

// The default output/ is the easiest way to lose a model: a second run there used to replace the
// first one's model.safetensors and log.jsonl without a word.
TEST(TrainCliSilent, AFreshRunDoesNotReplaceAnotherRunsModelAndLog) {
    Fixture f;
    ASSERT_EQ(run_command(f.base_cmd("run") + " --steps=2").exit_code, 0);
    const std::string model = read_file(f.dir / "run/model.safetensors");
    const std::string log = read_file(f.dir / "run/log.jsonl");

    // another run (another seed, other checkpoints) into the same --out-dir
    const std::string other = f.base_cmd("run") + " --steps=2 --seed=7 --checkpoint-dir=" + (f.dir / "other-ckpt");
    const auto r = run_command(other);
    expect_refused(r, "this fresh run would replace the output of an earlier run: '" + (f.dir / "run/log.jsonl") +
                          "' (the log, --log-file), '" + (f.dir / "run/model.safetensors") + "' (the model, --out-dir)");
    EXPECT_TRUE(Contains(r.output, "add --overwrite to replace them")) << r.output;
    EXPECT_EQ(read_file(f.dir / "run/model.safetensors"), model);
    EXPECT_EQ(read_file(f.dir / "run/log.jsonl"), log);
    EXPECT_FALSE(fs::exists(f.dir / "other-ckpt"));

    // the same command again is refused as well: its first result is still a model to keep
    expect_refused(run_command(f.base_cmd("run") + " --steps=2"), "would replace the output of an earlier run");

    // a --log-file elsewhere that holds a run's log is named, and so is the model alone
    fs::create_directories(f.dir / "logs");
    fs::copy_file(f.dir / "run/log.jsonl", f.dir / "logs/a.jsonl");
    const auto log_only = run_command(f.base_cmd("fresh") + " --steps=1 --log-file=" + (f.dir / "logs/a.jsonl"));
    expect_refused(log_only, "earlier run: '" + (f.dir / "logs/a.jsonl") + "' (the log, --log-file). Choose another "
                             "--out-dir / --log-file");
    EXPECT_TRUE(Contains(log_only.output, "add --overwrite to replace it")) << log_only.output;
    fs::remove(f.dir / "run/log.jsonl");
    expect_refused(run_command(other), "earlier run: '" + (f.dir / "run/model.safetensors") + "' (the model, --out-dir)");

    // asked for, it replaces them
    const auto over = run_command(other + " --overwrite");
    ASSERT_EQ(over.exit_code, 0) << over.output;
    EXPECT_TRUE(Contains(over.output, "--overwrite: replacing '" + (f.dir / "run/model.safetensors") + "'"))
        << over.output;
    EXPECT_NE(read_file(f.dir / "run/model.safetensors"), model);
}

// A run refused for its data has written a log of its set-up lines only; that log holds nothing to
// keep, so the corrected command is not refused for it.
TEST(TrainCliSilent, ALogWithoutAStepDoesNotBlockTheNextRun) {
    Fixture f;
    const auto bad = run_command(f.base_cmd("run") + " --steps=1 --train-file=" + (f.dir / "missing.bin"));
    ASSERT_EQ(bad.exit_code, 1) << bad.output;
    ASSERT_TRUE(fs::exists(f.dir / "run/log.jsonl"));
    const auto ok = run_command(f.base_cmd("run") + " --steps=1");
    EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

// Token files whose every target is masked used to train to the end (a note per step) and export the
// untrained model with exit code 0.
TEST(TrainCliSilent, TokenFilesWithEveryTargetMaskedAreRefused) {
    Fixture f;
    const std::vector<int32_t> tokens = make_tokens(4000, 3);
    const std::vector<uint8_t> none(tokens.size(), 0);
    const std::string masked = f.dir / "masked.bin";
    write_token_file(masked, tokens, kVocab, &none);
    expect_refused(run_command(f.base_cmd("a") + " --steps=2 --train-file=" + masked),
                   "--train-file: every target token of '" + masked + "' is masked");
    expect_refused(run_command(f.base_cmd("b") + " --steps=2 --eval-file=" + masked),
                   "--eval-file: every target token of '" + masked + "' is masked (mask bit 0: no loss), so there is "
                   "nothing to evaluate");
    EXPECT_FALSE(fs::exists(f.dir / "a/model.safetensors"));

    // only the first token trained: it is never a target (targets are tokens 1.. of each chunk)
    std::vector<uint8_t> first(tokens.size(), 0);
    first[0] = 1;
    write_token_file(masked, tokens, kVocab, &first);
    expect_refused(run_command(f.base_cmd("c") + " --steps=2 --train-file=" + masked), "is masked");

    // one trained target anywhere is something to learn from: it trains
    std::vector<uint8_t> one(tokens.size(), 0);
    one[tokens.size() / 2] = 1;
    write_token_file(masked, tokens, kVocab, &one);
    const auto ok = run_command(f.base_cmd("d") + " --steps=1 --eval-every-n-steps=0 --train-file=" + masked);
    EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

// --seed=-1 used to become 18446744073709551615; --comm-timeout=-1 printed a 309-digit bound.
TEST(TrainCliSilent, NegativeValuesAreRefusedInPlainWords) {
    Fixture f;
    auto r = run_command(f.base_cmd("x") + " --steps=1 --seed=-1");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "--seed: must be a non-negative integer (0 to 18446744073709551615), got -1"))
        << r.output;
    EXPECT_FALSE(fs::exists(f.dir / "x"));
    r = run_command(f.base_cmd("x") + " --steps=1 --comm-timeout=-1");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "--comm-timeout: must be >= 0, got -1")) << r.output;
    EXPECT_LT(r.output.size(), 400u) << r.output;
    // the largest seed is still a seed
    EXPECT_EQ(run_command(f.base_cmd("y") + " --steps=1 --seed=18446744073709551615").exit_code, 0);
}

// A warmup longer than the run never reaches the peak learning rate: accepted, and said.
TEST(TrainCliSilent, AWarmupLongerThanTheRunIsSaid) {
    Fixture f;
    const auto r = run_command(f.base_cmd("x") + " --steps=4 --warmup=8 --eval-every-n-steps=0");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // the last step's rate is 4/8 of the peak 1e-3
    EXPECT_TRUE(Contains(r.output, "note: --warmup=8 is longer than --steps=4: the learning rate only rises, to 0.0005 "
                                   "(50% of --learning-rate=0.001) at the last step, and never decays"))
        << r.output;
    const auto equal = run_command(f.base_cmd("y") + " --steps=4 --warmup=4 --eval-every-n-steps=0");
    ASSERT_EQ(equal.exit_code, 0) << equal.output;
    EXPECT_FALSE(Contains(equal.output, "--warmup=4 is longer")) << "warmup == steps reaches the peak at the last step";
}

// Paths named for what they are, not for a symptom of them.
TEST(TrainCliSilent, WrongPathsAreNamedForWhatTheyAre) {
    Fixture f;
    // a directory as --train-file / --eval-file used to be "no file matches"
    fs::create_directories(f.dir / "data");
    expect_refused(run_command(f.base_cmd("x") + " --steps=1 --train-file=" + (f.dir / "data")),
                   "--train-file: '" + (f.dir / "data") + "' is a directory, not a file: name the files in it, e.g. '" +
                       (f.dir / "data/*") + "'");
    expect_refused(run_command(f.base_cmd("x") + " --steps=1 --eval-file=" + (f.dir / "data")),
                   "--eval-file: '" + (f.dir / "data") + "' is a directory, not a file");

    // a config.json that is a directory used to be "not valid JSON"
    const std::string odd = f.dir / "odd-model";
    fs::create_directories(odd + "/config.json");
    const std::string train = train_exe() + " --device=cpu --from-scratch --train-file=" + f.train_file + " --out-dir=" +
                              (f.dir / "o") + " --checkpoint-dir=" + (f.dir / "c") + " --steps=1 --batch-size=2 --seq-len=16";
    auto r = run_command(train + " --model=" + odd);
    expect_refused(r, "--model: '" + odd + "/config.json' is a directory, not the model's config.json file");
    EXPECT_FALSE(Contains(r.output, "not valid JSON")) << r.output;

    // --model=dir/config.json (a file) used to be looked up in the HF cache
    r = run_command(train + " --model=" + f.model_dir + "/config.json");
    expect_refused(r, "--model: '" + f.model_dir + "/config.json' is a file; --model takes the model's directory");
    EXPECT_TRUE(Contains(r.output, "--model=" + f.model_dir)) << r.output;
    EXPECT_FALSE(Contains(r.output, "huggingface")) << r.output;
}
