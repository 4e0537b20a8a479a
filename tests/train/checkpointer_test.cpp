#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "model/imodel.h"
#include "test_util.h"
#include "train/checkpointer.h"

using namespace qtrain;
using namespace qtrain::test;
namespace fs = std::filesystem;

namespace {
// Writes one marker file, or fails half-way, to exercise atomicity.
class FakeModel : public IModel {
public:
    bool fail = false;
    ModelConfig cfg;
    const ModelConfig& config() const override { return cfg; }
    std::string device_name() const override { return "fake"; }
    void init_random(uint64_t) override {}
    void load_hf(const std::string&) override {}
    void save_hf(const std::string&) const override {}
    void forward_backward(const Batch&, float) override {}
    StepStats optimizer_step(const OptimizerParams&) override { return {}; }
    float evaluate(const Batch&) override { return 0; }
    void save_checkpoint(const std::string& dir) const override {
        write_file(dir + "/weights.bin", "w");
        if (fail) throw Error("disk full");
    }
    void load_checkpoint(const std::string&) override {}
    MemoryPlan memory_plan() const override { return {}; }
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
