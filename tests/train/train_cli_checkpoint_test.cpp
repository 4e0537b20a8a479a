// End-to-end tests of checkpoint integrity and housekeeping through the `train` program on the
// CPU: a corrupt or truncated newest checkpoint is reported and the previous one resumed (bit for
// bit), none left is a clear error, checkpoints without checksums still load, partial directories
// of killed runs are removed, and --ckpt-keep keeps the newest N.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;
namespace fs = std::filesystem;

namespace {

// --steps=12, a checkpoint every 5 steps: part-ckpt/step_00000005 and step_00000010.
const std::string kCommon = " --steps=12 --eval-every-n-steps=0 --ckpt-interval=5";

void flip_last_byte(const std::string& path) {  // the last weight's top byte: sign and exponent
    std::string bytes = read_file(path);
    ASSERT_FALSE(bytes.empty()) << path;
    bytes.back() ^= 0x40;
    write_file(path, bytes);
}

std::vector<nlohmann::json> events(const std::string& log_path, const std::string& kind) {
    std::vector<nlohmann::json> out;
    std::istringstream in(read_file(log_path));
    std::string line;
    while (std::getline(in, line)) {
        auto j = nlohmann::json::parse(line);
        if (j["log"] == kind) out.push_back(j);
    }
    return out;
}

std::set<std::string> names_in(const std::string& dir) {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
    return names;
}

// The uninterrupted run's 12 losses and a checkpointed run of the same flags ("part").
std::vector<double> full_and_part_runs(const Fixture& f) {
    auto full = run_command(f.base_cmd("full") + kCommon);
    EXPECT_EQ(full.exit_code, 0) << full.output;
    auto part = run_command(f.base_cmd("part") + kCommon);
    EXPECT_EQ(part.exit_code, 0) << part.output;
    return step_losses(f.dir / "full/log.jsonl");
}

// The resumed run's losses equal the uninterrupted run's from `from` on, bit for bit.
void expect_resumed_losses_match(const Fixture& f, const std::vector<double>& full, int from) {
    int first_step = -1;
    auto resumed = step_losses(f.dir / "resumed.jsonl", &first_step);
    EXPECT_EQ(first_step, from);
    ASSERT_EQ(resumed.size(), full.size() - from);
    for (std::size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], full[from + i]) << "step " << from + i;
}

std::string resume_cmd(const Fixture& f) {
    return f.base_cmd("part") + kCommon + " --continue --log-file=" + (f.dir / "resumed.jsonl");
}

}  // namespace

// One flipped byte in the newest checkpoint's weights (before checksums it resumed silently with a
// loss of ~2600): the file is named, the run resumes from step 5 and reproduces the full run.
TEST(TrainCliCheckpoint, CorruptNewestCheckpointFallsBackToThePreviousOne) {
    Fixture f;
    const auto full = full_and_part_runs(f);
    ASSERT_EQ(full.size(), 12u);
    const std::string bad = f.dir / "part-ckpt/step_00000010/model.safetensors";
    flip_last_byte(bad);

    auto r = run_command(resume_cmd(f));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, bad + ": corrupt"));
    EXPECT_TRUE(Contains(r.output, "[Resume] from " + (f.dir / "part-ckpt/step_00000005") + " at step 5"));
    EXPECT_TRUE(Contains(r.output, "previous complete checkpoint"));
    expect_resumed_losses_match(f, full, 5);

    const auto rejected = events(f.dir / "resumed.jsonl", "checkpoint_rejected");
    ASSERT_EQ(rejected.size(), 1u);
    EXPECT_EQ(rejected[0]["path"], f.dir / "part-ckpt/step_00000010");
    EXPECT_TRUE(Contains(rejected[0]["error"].get<std::string>(), bad));
    const auto resume = events(f.dir / "resumed.jsonl", "resume");
    ASSERT_EQ(resume.size(), 1u);
    EXPECT_EQ(resume[0]["step"], 5);
    EXPECT_EQ(resume[0]["skipped"], 1);
}

// A file cut short (a full disk, a copy that stopped) is caught by its size before any hashing.
TEST(TrainCliCheckpoint, TruncatedNewestCheckpointFallsBackToThePreviousOne) {
    Fixture f;
    const auto full = full_and_part_runs(f);
    ASSERT_EQ(full.size(), 12u);
    const std::string bad = f.dir / "part-ckpt/step_00000010/optimizer.safetensors";
    fs::resize_file(bad, fs::file_size(bad) / 2);

    auto r = run_command(resume_cmd(f));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, bad + ": truncated"));
    EXPECT_TRUE(Contains(r.output, "[Resume] from " + (f.dir / "part-ckpt/step_00000005") + " at step 5"));
    expect_resumed_losses_match(f, full, 5);
}

// The newest checkpoint lost its state.json (deleted by hand, left out of a copy): it used to be passed
// over without a word, an older one resumed and the newer one overwritten. Now it is named with the
// reason, logged as rejected, and the output says it will be replaced (issue 29).
TEST(TrainCliCheckpoint, NewestCheckpointWithoutStateJsonIsNamedAndSkipped) {
    Fixture f;
    const auto full = full_and_part_runs(f);
    ASSERT_EQ(full.size(), 12u);
    const std::string newest = f.dir / "part-ckpt/step_00000010";
    fs::remove(newest + "/state.json");

    auto r = run_command(resume_cmd(f));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "[Resume] cannot resume from " + newest + ": " + newest + "/state.json is missing"))
        << r.output;
    EXPECT_TRUE(Contains(r.output, "[Resume] from " + (f.dir / "part-ckpt/step_00000005") + " at step 5")) << r.output;
    EXPECT_TRUE(Contains(r.output, "replaced when this run writes a checkpoint of its step")) << r.output;
    expect_resumed_losses_match(f, full, 5);
    const auto rejected = events(f.dir / "resumed.jsonl", "checkpoint_rejected");
    ASSERT_EQ(rejected.size(), 1u);
    EXPECT_EQ(rejected[0]["path"], newest);
    // the resumed run wrote step 10 again: a complete checkpoint now
    EXPECT_TRUE(fs::exists(newest + "/state.json"));

    // every checkpoint without its state.json: an error, not a silent start from step 0
    fs::remove(newest + "/state.json");
    fs::remove(f.dir / "part-ckpt/step_00000005/state.json");
    r = run_command(resume_cmd(f));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Contains(r.output, "error: --continue: none of the 2 checkpoint(s)")) << r.output;
    EXPECT_TRUE(Contains(r.output, "state.json is missing")) << r.output;
    EXPECT_FALSE(Contains(r.output, "[T] step")) << r.output;
}

// Nothing usable left: a clear error naming the files, exit code 1, and no silent start from step 0.
TEST(TrainCliCheckpoint, AllCheckpointsCorruptIsAClearError) {
    Fixture f;
    full_and_part_runs(f);
    flip_last_byte(f.dir / "part-ckpt/step_00000010/model.safetensors");
    flip_last_byte(f.dir / "part-ckpt/step_00000005/optimizer.safetensors");

    auto r = run_command(resume_cmd(f));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(Contains(r.output, "error: --continue: none of the 2 checkpoint(s)"));
    EXPECT_TRUE(Contains(r.output, f.dir / "part-ckpt/step_00000010/model.safetensors"));
    EXPECT_TRUE(Contains(r.output, f.dir / "part-ckpt/step_00000005/optimizer.safetensors"));
    EXPECT_FALSE(Contains(r.output, "internal error"));
    EXPECT_FALSE(Contains(r.output, "[T] step"));
}

// Checkpoints written before checksums (no "files" in state.json) still resume, with a note.
TEST(TrainCliCheckpoint, CheckpointWithoutChecksumsStillResumes) {
    Fixture f;
    const auto full = full_and_part_runs(f);
    ASSERT_EQ(full.size(), 12u);
    const std::string state = f.dir / "part-ckpt/step_00000010/state.json";
    auto j = nlohmann::json::parse(read_file(state));
    EXPECT_TRUE(j.contains("files"));
    j.erase("files");  // as qtrain wrote checkpoints before it recorded checksums
    write_file(state, j.dump(2));

    auto r = run_command(resume_cmd(f));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "no checksums"));
    EXPECT_TRUE(Contains(r.output, "[Resume] from " + (f.dir / "part-ckpt/step_00000010") + " at step 10"));
    expect_resumed_losses_match(f, full, 10);
    const auto resume = events(f.dir / "resumed.jsonl", "resume");
    ASSERT_EQ(resume.size(), 1u);
    EXPECT_EQ(resume[0]["verified"], false);
}

// Killed runs leave .tmp_step_XXXXXXXX_<pid>; the next run that writes a checkpoint removes those
// whose process is gone (saying so, with the size) and keeps the one of a live process.
TEST(TrainCliCheckpoint, PartialCheckpointsOfDeadRunsAreRemoved) {
    Fixture f;
    const pid_t dead = [] {
        const pid_t pid = ::fork();
        if (pid == 0) ::_exit(0);
        ::waitpid(pid, nullptr, 0);
        return pid;
    }();
    const std::string ckpt = f.dir / "run-ckpt";
    const std::string stale = ".tmp_step_00000003_" + std::to_string(dead);
    const std::string live = ".tmp_step_00000004_" + std::to_string(::getpid());  // this test: alive
    const std::string odd = ".tmp_step_0000003_" + std::to_string(dead);         // not the pattern
    for (const auto& d : {stale, live, odd}) fs::create_directories(ckpt + "/" + d);
    write_file(ckpt + "/" + stale + "/model.safetensors", std::string(1 << 20, 'x'));

    auto r = run_command(f.base_cmd("run") + " --steps=5 --eval-every-n-steps=0 --ckpt-interval=5");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(Contains(r.output, "removed " + ckpt + "/" + stale + " (1.00 MiB)"));
    EXPECT_TRUE(Contains(r.output, "process " + std::to_string(dead)));
    EXPECT_EQ(names_in(ckpt), (std::set<std::string>{live, odd, "step_00000005"}));
    const auto removed = events(f.dir / "run/log.jsonl", "checkpoint_removed");
    ASSERT_EQ(removed.size(), 1u);
    EXPECT_EQ(removed[0]["path"], ckpt + "/" + stale);
    EXPECT_EQ(removed[0]["bytes"], 1 << 20);
}

// --ckpt-keep=2 leaves exactly the two newest checkpoints, and nothing else is touched.
TEST(TrainCliCheckpoint, CkptKeepLeavesTheNewestTwo) {
    Fixture f;
    const std::string ckpt = f.dir / "run-ckpt";
    fs::create_directories(ckpt + "/notes");
    write_file(ckpt + "/step_00000001.txt", "mine");
    auto r = run_command(f.base_cmd("run") + " --steps=20 --eval-every-n-steps=0 --ckpt-interval=4 --ckpt-keep=2");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(names_in(ckpt), (std::set<std::string>{"step_00000016", "step_00000020", "notes", "step_00000001.txt"}));
    EXPECT_TRUE(Contains(r.output, "removed " + ckpt + "/step_00000004"));
    EXPECT_EQ(events(f.dir / "run/log.jsonl", "checkpoint_removed").size(), 3u);  // steps 4, 8, 12

    auto bad = run_command(f.base_cmd("bad") + " --steps=2 --ckpt-keep=-1");
    EXPECT_EQ(bad.exit_code, 1) << bad.output;
    EXPECT_TRUE(Contains(bad.output, "--ckpt-keep must be >= 0"));
}

// --export-checkpoint writes the HF model of a checkpoint without training: the same tensors and
// config.json as the run's own export at that step; a damaged checkpoint is refused naming its file.
TEST(TrainCliCheckpoint, ExportCheckpointWritesTheModelTheRunWouldHaveExported) {
    Fixture f;
    auto run = run_command(f.base_cmd("run") + " --steps=4 --ckpt-interval=4 --eval-every-n-steps=0");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const std::string ckpt = f.dir / "run-ckpt/step_00000004";
    auto e = run_command(train_exe() + " --export-checkpoint=" + ckpt + " --out-dir=" + (f.dir / "exported"));
    ASSERT_EQ(e.exit_code, 0) << e.output;
    EXPECT_TRUE(Contains(e.output, "checksums verified")) << e.output;
    EXPECT_FALSE(Contains(e.output, "[T] step")) << e.output;
    SafeTensorsReader a({f.dir / "run/model.safetensors"}), b({f.dir / "exported/model.safetensors"});
    auto names = [](const SafeTensorsReader& r) {
        auto n = r.names();
        return std::set<std::string>(n.begin(), n.end());
    };
    ASSERT_EQ(names(a), names(b));
    for (const auto& name : a.names()) {
        const Tensor ta = a.view(name), tb = b.view(name);
        ASSERT_EQ(ta.nbytes(), tb.nbytes()) << name;
        EXPECT_EQ(0, std::memcmp(ta.data, tb.data, ta.nbytes())) << name;
    }
    EXPECT_EQ(read_file(f.dir / "run/config.json"), read_file(f.dir / "exported/config.json"));

    auto none = run_command(train_exe() + " --export-checkpoint=" + (f.dir / "run-ckpt") + " --out-dir=" + (f.dir / "x"));
    EXPECT_EQ(none.exit_code, 1);
    EXPECT_TRUE(Contains(none.output, "is not a complete checkpoint")) << none.output;
    {  // one flipped byte in the weights
        std::string bytes = read_file(ckpt + "/model.safetensors");
        bytes[bytes.size() - 3] ^= 0x20;
        write_file(ckpt + "/model.safetensors", bytes);
    }
    auto bad = run_command(train_exe() + " --export-checkpoint=" + ckpt + " --out-dir=" + (f.dir / "bad"));
    EXPECT_EQ(bad.exit_code, 1) << bad.output;
    EXPECT_TRUE(Contains(bad.output, "model.safetensors")) << bad.output;
    EXPECT_FALSE(fs::exists(f.dir / "bad/model.safetensors"));
}
