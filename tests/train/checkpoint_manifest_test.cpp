// The checkpoint manifest (state.json's "shards", train/checkpointer.h): written by rank 0 from the
// blocks every rank wrote, with their ranges and dtypes; a block set that does not tile the flat space
// fails the checkpoint instead of its resume; checkpoints of named tensors have none.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "block_checkpoint_util.h"
#include "comm/run_ranks.h"
#include "io/flat_state_reader.h"
#include "model/imodel.h"
#include "test_util.h"
#include "train/stub_model.h"
#include "train/checkpointer.h"

using namespace qtrain;
using namespace qtrain::test;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kTotal = 300;

FlatLayout layout() {
    FlatLayout l;
    l.tensors = {{"a", 0, {10, 10}}, {"b", 128, {150}}};
    l.total = kTotal;
    return l;
}

FlatArrays state() {
    FlatArrays s;
    for (int a = 0; a < 3; ++a) {
        s[a].assign(kTotal, 0.0f);
        for (const FlatTensor& t : layout().tensors)
            for (int64_t i = 0; i < t.numel(); ++i) s[a][t.offset + i] = 0.5f * a + 0.001f * (t.offset + i);
    }
    return s;
}

// Rank r writes its block of the 3-rank partition (or, `gap`, leaves one element out).
class BlockModel : public StubModel {
public:
    int rank = 0, world = 1;
    bool gap = false;
    void save_checkpoint(const std::string& dir) const override {
        Ranges all = shard_ranges(kTotal, world);
        if (gap) all[1].first += 1;
        // write_blocks writes every rank's file; this rank keeps only its own
        const std::string mine = (fs::path(dir) / ("rank" + std::to_string(rank))).string();
        write_blocks(mine, state(), kTotal, all, {.piece = 64, .store = {DType::F32, DType::BF16, DType::F32}});
        fs::rename(fs::path(mine) / block_file_name(rank, world), fs::path(dir) / block_file_name(rank, world));
        fs::remove_all(mine);
    }
};

CheckpointState checkpoint_state() {
    CheckpointState s;
    s.step = 4;
    s.options_json = R"({"steps": 10})";
    s.config_json = R"({"vocab_size": 10})";
    s.device = "cuda";
    return s;
}

}  // namespace

TEST(CheckpointManifest, RecordsEveryRanksBlockAndTheReaderAcceptsIt) {
    TempDir d;
    std::string dir;
    comm::run_ranks(3, [&](comm::Communicator& c) {
        BlockModel m;
        m.rank = c.rank();
        m.world = c.world();
        const std::string written = write_checkpoint(c, d.str(), m, checkpoint_state());
        if (c.rank() == 0) dir = written;
    });
    const auto j = nlohmann::json::parse(read_file(dir + "/state.json"));
    ASSERT_TRUE(j.contains("shards")) << j.dump(2);
    const auto& s = j["shards"];
    EXPECT_EQ(s["world"], 3);
    EXPECT_EQ(s["total"], kTotal);
    EXPECT_EQ(s["piece_elements"], 64);
    EXPECT_EQ(s["zero_level"], 1);
    EXPECT_EQ(s["dtypes"], nlohmann::json({{"master", "F32"}, {"exp_avg", "BF16"}, {"exp_avg_sq", "F32"}}));
    ASSERT_EQ(s["blocks"].size(), 3u);
    for (int r = 0; r < 3; ++r) {
        EXPECT_EQ(s["blocks"][r]["file"], block_file_name(r, 3));
        EXPECT_EQ(s["blocks"][r]["begin"], shard_ranges(kTotal, 3)[r].first);
        EXPECT_EQ(s["blocks"][r]["end"], shard_ranges(kTotal, 3)[r].second);
        EXPECT_TRUE(j["files"].contains(block_file_name(r, 3)));
    }
    EXPECT_TRUE(verify_checkpoint(dir));
    const FlatStateReader reader(dir, layout());  // checks the blocks against the manifest
    std::vector<float> b(150);
    reader.read_tensor(FlatArray::Master, "b", b.data());
    EXPECT_EQ(b[7], state()[0][128 + 7]);
}

TEST(CheckpointManifest, BlocksThatDoNotTileTheSpaceFailTheCheckpoint) {
    TempDir d;
    EXPECT_ERROR(comm::run_ranks(2,
                                 [&](comm::Communicator& c) {
                                     BlockModel m;
                                     m.rank = c.rank();
                                     m.world = c.world();
                                     m.gap = true;
                                     write_checkpoint(c, d.str(), m, checkpoint_state());
                                 }),
                 "block-00001-of-00002.safetensors", "begins at element");
    EXPECT_FALSE(find_latest_checkpoint(d.str()).has_value());
}

TEST(CheckpointManifest, NamedCheckpointsHaveNone) {
    TempDir d;
    BlockModel m;  // one rank's "blocks" would be blocks too: write named files instead
    struct Named : BlockModel {
        void save_checkpoint(const std::string& dir) const override { write_named(dir, state(), layout()); }
    } named;
    const std::string dir = write_checkpoint(d.str(), named, checkpoint_state());
    EXPECT_FALSE(nlohmann::json::parse(read_file(dir + "/state.json")).contains("shards"));
}
