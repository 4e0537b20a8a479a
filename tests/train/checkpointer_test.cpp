#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "comm/run_ranks.h"
#include "core/error.h"
#include "model/imodel.h"
#include "test_util.h"
#include "train/stub_model.h"
#include "train/checkpointer.h"

using namespace qtrain;
using namespace qtrain::test;
namespace fs = std::filesystem;

namespace {
// Writes one marker file, or fails half-way, to exercise atomicity.
class FakeModel : public StubModel {
public:
    bool fail = false;
    void save_checkpoint(const std::string& dir) const override {
        write_file(dir + "/weights.bin", "w");
        if (fail) throw Error("disk full");
    }
};

CheckpointState state(int step) {
    CheckpointState s;
    s.step = step;
    s.train_data = {2, 17};
    s.options_json = R"({"steps": 100})";
    s.config_json = R"({"vocab_size": 10})";
    s.device = "cpu";
    return s;
}
}  // namespace

TEST(Checkpointer, WritesAndReadsState) {
    TempDir d;
    FakeModel m;
    std::string dir = write_checkpoint(d.str(), m, state(20));
    EXPECT_EQ(dir, d / "step_00000020");
    EXPECT_TRUE(fs::exists(dir + "/weights.bin"));
    CheckpointState s = read_checkpoint_state(dir);
    EXPECT_EQ(s.step, 20);
    EXPECT_EQ(s.train_data.epoch, 2);
    EXPECT_EQ(s.train_data.position, 17);
    EXPECT_EQ(s.device, "cpu");
}

TEST(Checkpointer, LatestSkipsIncompleteAndForeignDirectories) {
    TempDir d;
    FakeModel m;
    EXPECT_FALSE(find_latest_checkpoint(d.str()).has_value());
    EXPECT_FALSE(find_latest_checkpoint(d / "missing").has_value());
    write_checkpoint(d.str(), m, state(5));
    write_checkpoint(d.str(), m, state(10));
    fs::create_directories(d / "step_00000015");            // no state.json: crashed mid-write
    fs::create_directories(d / "step_x0000020");
    fs::create_directories(d / ".tmp_step_00000030_1");
    write_file(d / ".tmp_step_00000030_1/state.json", "{}");
    EXPECT_EQ(*find_latest_checkpoint(d.str()), d / "step_00000010");
}

TEST(Checkpointer, FailedWriteLeavesNoCheckpoint) {
    TempDir d;
    FakeModel m;
    m.fail = true;
    EXPECT_THROW(write_checkpoint(d.str(), m, state(7)), Error);
    EXPECT_FALSE(find_latest_checkpoint(d.str()).has_value());
    for (const auto& e : fs::directory_iterator(d.str())) ADD_FAILURE() << "left behind: " << e.path();
}

TEST(Checkpointer, CorruptStateIsAClearError) {
    TempDir d;
    fs::create_directories(d / "step_00000001");
    write_file(d / "step_00000001/state.json", "{not json");
    try {
        read_checkpoint_state(d / "step_00000001");
        FAIL();
    } catch (const Error& e) {
        EXPECT_TRUE(Contains(e.what(), "state.json"));
    }
    write_file(d / "step_00000001/state.json", R"({"format": "other"})");
    EXPECT_THROW(read_checkpoint_state(d / "step_00000001"), Error);
}

namespace {
// A pid that belonged to a process which has exited (and been reaped): what a killed run leaves.
pid_t dead_pid() {
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(0);
    ::waitpid(pid, nullptr, 0);
    return pid;
}

std::set<std::string> names_in(const std::string& dir) {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
    return names;
}

void flip_last_byte(const std::string& path) {
    std::string bytes = read_file(path);
    bytes.back() ^= 0x01;
    write_file(path, bytes);
}
}  // namespace

// state.json lists every file the model wrote with its size and XXH3-64 (`xxhsum -H3` of "w").
TEST(Checkpointer, RecordsTheChecksumOfEveryFileTheModelWrote) {
    TempDir d;
    FakeModel m;
    const std::string dir = write_checkpoint(d.str(), m, state(3));
    const auto j = nlohmann::json::parse(read_file(dir + "/state.json"));
    ASSERT_TRUE(j.contains("files")) << j.dump(2);
    EXPECT_EQ(j["files"].size(), 1u);
    EXPECT_EQ(j["files"]["weights.bin"]["bytes"], 1);
    EXPECT_EQ(j["files"]["weights.bin"]["xxh3_64"], "aceee8f5de193e29");
    EXPECT_TRUE(verify_checkpoint(dir));
}

TEST(Checkpointer, VerifyNamesTheCorruptTruncatedOrMissingFile) {
    TempDir d;
    FakeModel m;
    const std::string dir = write_checkpoint(d.str(), m, state(3));
    const std::string file = dir + "/weights.bin";
    flip_last_byte(file);
    EXPECT_ERROR(verify_checkpoint(dir), file, "corrupt");
    write_file(file, "");
    EXPECT_ERROR(verify_checkpoint(dir), file, "truncated");
    fs::remove(file);
    EXPECT_ERROR(verify_checkpoint(dir), file, "missing");
}

TEST(Checkpointer, CheckpointWithoutChecksumsIsLoadedUnverified) {
    TempDir d;
    FakeModel m;
    const std::string dir = write_checkpoint(d.str(), m, state(3));
    auto j = nlohmann::json::parse(read_file(dir + "/state.json"));
    j.erase("files");  // as qtrain wrote it before checksums
    write_file(dir + "/state.json", j.dump());
    EXPECT_FALSE(verify_checkpoint(dir));
    const ResumePoint rp = find_resume_point(d.str(), [](const std::string&, const std::string&) { FAIL(); });
    EXPECT_EQ(rp.dir, dir);
    EXPECT_FALSE(rp.verified);
    EXPECT_EQ(rp.state.step, 3);
}

TEST(Checkpointer, ListsCompleteCheckpointsNewestFirst) {
    TempDir d;
    FakeModel m;
    EXPECT_TRUE(list_complete_checkpoints(d / "missing").empty());
    for (int step : {10, 5, 100}) write_checkpoint(d.str(), m, state(step));
    fs::create_directories(d / "step_00000200");  // no state.json
    EXPECT_EQ(list_complete_checkpoints(d.str()),
              (std::vector<std::string>{d / "step_00000100", d / "step_00000010", d / "step_00000005"}));
}

TEST(Checkpointer, ResumePointFallsBackPastCorruptCheckpoints) {
    TempDir d;
    FakeModel m;
    for (int step : {5, 10, 15}) write_checkpoint(d.str(), m, state(step));
    flip_last_byte(d / "step_00000015/weights.bin");
    write_file(d / "step_00000010/state.json", "{truncated");
    std::vector<std::string> rejected;
    const ResumePoint rp = find_resume_point(d.str(), [&](const std::string& dir, const std::string& error) {
        rejected.push_back(dir);
        if (dir == d / "step_00000015") EXPECT_TRUE(Contains(error, d / "step_00000015/weights.bin"));
        if (dir == d / "step_00000010") EXPECT_TRUE(Contains(error, d / "step_00000010/state.json"));
    });
    EXPECT_EQ(rp.dir, d / "step_00000005");
    EXPECT_EQ(rp.state.step, 5);
    EXPECT_TRUE(rp.verified);
    EXPECT_EQ(rp.skipped, 2);
    EXPECT_EQ(rejected, (std::vector<std::string>{d / "step_00000015", d / "step_00000010"}));

    flip_last_byte(d / "step_00000005/weights.bin");
    EXPECT_ERROR(find_resume_point(d.str(), [](const std::string&, const std::string&) {}), "--continue",
                 "none of the 3", d / "step_00000015/weights.bin");
}

TEST(Checkpointer, RemovesOnlyPartialCheckpointsOfDeadProcesses) {
    TempDir d;
    const pid_t dead = dead_pid();
    const std::string stale = fmt::format(".tmp_step_00000005_{}", dead);
    const std::string own = fmt::format(".tmp_step_00000006_{}", ::getpid());   // a reused pid: ours
    const std::string live = fmt::format(".tmp_step_00000007_{}", ::getppid());  // alive: kept
    fs::create_directories(d / (stale + "/sub"));
    write_file(d / (stale + "/model.safetensors"), std::string(1000, 'x'));
    write_file(d / (stale + "/sub/more"), std::string(24, 'x'));
    fs::create_directories(d / own);
    fs::create_directories(d / live);
    // not partial checkpoints of that exact name, or not directories: never touched
    const std::vector<std::string> foreign = {fmt::format(".tmp_step_0000005_{}", dead),
                                              fmt::format(".tmp_step_00000005_{}x", dead),
                                              fmt::format(".tmp_step_00000005_{}_old", dead),
                                              fmt::format("tmp_step_00000005_{}", dead), "step_00000005",
                                              ".tmp_step_00000005_"};
    for (const auto& f : foreign) fs::create_directories(d / f);
    write_file(d / fmt::format(".tmp_step_00000008_{}", dead), "a file");
    fs::create_directories(d / "elsewhere");
    write_file(d / "elsewhere/keep", "x");
    fs::create_directory_symlink(d / "elsewhere", d / fmt::format(".tmp_step_00000009_{}", dead));

    const auto removed = remove_partial_checkpoints(d.str());
    ASSERT_EQ(removed.size(), 2u);
    std::set<std::string> paths;
    for (const auto& r : removed) {
        paths.insert(r.path);
        EXPECT_TRUE(r.error.empty()) << r.error;
        EXPECT_TRUE(Contains(r.reason, "no longer running"));
        if (r.path == d / stale) EXPECT_EQ(r.bytes, 1024u);
    }
    EXPECT_EQ(paths, (std::set<std::string>{d / stale, d / own}));
    std::set<std::string> left = names_in(d.str());
    EXPECT_FALSE(left.count(stale));
    EXPECT_FALSE(left.count(own));
    EXPECT_TRUE(left.count(live));
    for (const auto& f : foreign) EXPECT_TRUE(left.count(f)) << f;
    EXPECT_TRUE(fs::exists(d / "elsewhere/keep"));
    EXPECT_TRUE(remove_partial_checkpoints(d / "missing").empty());
}

TEST(Checkpointer, PruneKeepsTheNewestAndTheOneJustWritten) {
    TempDir d;
    FakeModel m;
    for (int step : {5, 10, 15, 20}) write_checkpoint(d.str(), m, state(step));
    fs::create_directories(d / "step_00000025");  // incomplete: not a checkpoint, not ours to remove
    fs::create_directories(d / "notes");
    write_file(d / "step_00000001.txt", "x");

    EXPECT_TRUE(prune_checkpoints(d.str(), 0, d / "step_00000020").empty());  // 0 = keep all
    const auto removed = prune_checkpoints(d.str(), 2, d / "step_00000020");
    ASSERT_EQ(removed.size(), 2u);
    EXPECT_EQ(removed[0].path, d / "step_00000010");
    EXPECT_EQ(removed[1].path, d / "step_00000005");
    EXPECT_TRUE(removed[0].error.empty()) << removed[0].error;
    EXPECT_TRUE(Contains(removed[0].reason, "--ckpt-keep=2"));
    EXPECT_GT(removed[0].bytes, 0u);
    EXPECT_EQ(names_in(d.str()),
              (std::set<std::string>{"step_00000015", "step_00000020", "step_00000025", "notes", "step_00000001.txt"}));

    // the one just written stays even when newer ones exist (a run resumed from before them)
    const auto again = prune_checkpoints(d.str(), 1, d / "step_00000015");
    EXPECT_TRUE(again.empty());
    EXPECT_EQ(list_complete_checkpoints(d.str()), (std::vector<std::string>{d / "step_00000020", d / "step_00000015"}));
}

namespace {
// One rank's model in a collective checkpoint: rank r writes part_r.bin, except rank 1, which holds
// nothing of its own and writes nothing; `failing_rank` throws after writing its part.
class RankPartModel : public FakeModel {
public:
    int rank = 0, failing_rank = -1;
    void save_checkpoint(const std::string& dir) const override {
        if (rank != 1) write_file(dir + "/part_" + std::to_string(rank) + ".bin", "rank " + std::to_string(rank));
        if (rank == failing_rank) throw Error("disk full on rank " + std::to_string(rank));
    }
};
}  // namespace

TEST(Checkpointer, CollectiveWriteRecordsEveryRanksPart) {
    TempDir d;
    std::vector<std::string> dirs(3);
    comm::run_ranks(3, [&](comm::Communicator& c) {
        RankPartModel m;
        m.rank = c.rank();
        dirs[c.rank()] = write_checkpoint(c, d.str(), m, state(6));
        // it returns once the checkpoint is complete, on every rank
        EXPECT_TRUE(fs::exists(dirs[c.rank()] + "/state.json")) << "rank " << c.rank();
    });
    for (const std::string& dir : dirs) EXPECT_EQ(dir, d / "step_00000006");
    const auto j = nlohmann::json::parse(read_file(dirs[0] + "/state.json"));
    EXPECT_EQ(j["world_size"], 3);
    std::set<std::string> files;
    for (const auto& [name, f] : j["files"].items()) files.insert(name);
    EXPECT_EQ(files, (std::set<std::string>{"part_0.bin", "part_2.bin"})) << "every rank's files, rank 0 hashed all";
    EXPECT_TRUE(verify_checkpoint(dirs[0]));
    EXPECT_EQ(read_checkpoint_state(dirs[0]).world_size, 3);
    for (const auto& e : fs::directory_iterator(d.str()))
        EXPECT_EQ(e.path().filename(), "step_00000006") << "left behind: " << e.path();
}

TEST(Checkpointer, CollectiveWriteThatFailsOnOneRankLeavesNoCheckpoint) {
    TempDir d;
    EXPECT_ERROR(comm::run_ranks(3,
                                 [&](comm::Communicator& c) {
                                     RankPartModel m;
                                     m.rank = c.rank();
                                     m.failing_rank = 2;
                                     write_checkpoint(c, d.str(), m, state(6));
                                 }),
                 "rank 2 of 3 failed: disk full on rank 2");
    EXPECT_FALSE(find_latest_checkpoint(d.str()).has_value());
    for (const auto& e : fs::directory_iterator(d.str())) ADD_FAILURE() << "left behind: " << e.path();
}

TEST(Checkpointer, StateWithoutWorldSizeIsOneRanks) {
    TempDir d;
    FakeModel m;
    const std::string dir = write_checkpoint(d.str(), m, state(3));
    auto j = nlohmann::json::parse(read_file(dir + "/state.json"));
    EXPECT_EQ(j["world_size"], 1);
    j.erase("world_size");  // as qtrain wrote them before it recorded the world size
    write_file(dir + "/state.json", j.dump());
    EXPECT_EQ(read_checkpoint_state(dir).world_size, 1);
}
