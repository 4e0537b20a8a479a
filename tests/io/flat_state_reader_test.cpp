// FlatStateReader (io/flat_state_reader.h): any range of a checkpoint's flat state, from the blocks of
// any world size or from named tensors, element for element as it was stored; and every way a block
// checkpoint can be incomplete or inconsistent refused with an error naming the file or the ranks.
// The flat space has odd tensor sizes, padding between them and a total (1001) that is a multiple of
// neither 64 nor the world sizes; pieces of 100 elements, so blocks span several with a short last one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "block_checkpoint_util.h"
#include "core/rng.h"
#include "io/flat_state_reader.h"
#include "test_util.h"

using namespace qtrain;
using namespace qtrain::test;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kTotal = 1001;

FlatLayout layout(int64_t total = kTotal) {
    FlatLayout l;
    l.tensors = {{"embed", 0, {7, 9}}, {"norm", 64, {13}}, {"w", 128, {5, 3, 4}}, {"bias", 192, {1}},
                 {"head", 196, {11, 73}}};
    l.total = total;
    return l;
}

// Random values in the tensors, 0 in the padding (as the models keep it); the moments positive.
FlatArrays source(uint64_t seed) {
    FlatArrays s;
    Rng rng(seed);
    for (int a = 0; a < 3; ++a) {
        s[a].assign(kTotal, 0.0f);
        for (const FlatTensor& t : layout().tensors)
            for (int64_t i = 0; i < t.numel(); ++i) {
                const float x = rng.normal();
                s[a][t.offset + i] = a == 2 ? x * x : x;
            }
    }
    return s;
}

// out must equal the source's [begin, end) bit for bit
::testing::AssertionResult same_range(const std::vector<float>& out, const std::vector<float>& src, int64_t begin,
                                      int64_t end) {
    if (static_cast<int64_t>(out.size()) != end - begin) return ::testing::AssertionFailure() << "size";
    for (int64_t i = begin; i < end; ++i)
        if (std::memcmp(&out[i - begin], &src[i], sizeof(float)) != 0)
            return ::testing::AssertionFailure() << "element " << i << " of [" << begin << ", " << end
                                                 << "): " << out[i - begin] << " vs " << src[i];
    return ::testing::AssertionSuccess();
}

std::vector<float> read(const FlatStateReader& r, FlatArray a, int64_t begin, int64_t end) {
    std::vector<float> out(end - begin, std::numeric_limits<float>::quiet_NaN());  // every element must be set
    r.read(a, begin, end, out.data());
    return out;
}

// Every array at every rank's block of worlds 1-4, and ranges across tensors, pieces and blocks.
void expect_reads_everything(const FlatStateReader& r, const FlatArrays& expected) {
    Ranges ranges;
    for (int world = 1; world <= 4; ++world)
        for (auto range : shard_ranges(kTotal, world)) ranges.push_back(range);
    Rng rng(5);
    for (int i = 0; i < 40; ++i) {
        const int64_t a = rng.below(kTotal + 1), b = rng.below(kTotal + 1);
        ranges.emplace_back(std::min(a, b), std::max(a, b));
    }
    ranges.insert(ranges.end(), {{0, 0}, {99, 101}, {499, 513}, {1000, 1001}, {63, 64}});
    for (const auto& [begin, end] : ranges)
        for (int a = 0; a < 3; ++a)
            EXPECT_TRUE(same_range(read(r, kFlatArrays[a], begin, end), expected[a], begin, end))
                << flat_array_name(kFlatArrays[a]);
}

}  // namespace

TEST(FlatStateReader, ReadsAnyRangeFromTheBlocksOfAnyWorldSize) {
    const FlatArrays s = source(1);
    const std::vector<std::pair<const char*, Ranges>> writers = {
        {"2 ranks", shard_ranges(kTotal, 2)},
        {"3 ranks", shard_ranges(kTotal, 3)},
        {"5 ranks, the last one empty", shard_ranges(kTotal, 5)},
        {"3 uneven blocks, not 64-aligned", {{0, 1}, {1, 517}, {517, kTotal}}},
    };
    ASSERT_EQ(shard_ranges(kTotal, 5).back().first, shard_ranges(kTotal, 5).back().second);
    for (const auto& [name, ranges] : writers) {
        SCOPED_TRACE(name);
        TempDir d;
        write_blocks(d.str(), s, kTotal, ranges, {.layout = layout().fingerprint()});
        const FlatStateReader r(d.str(), layout());
        EXPECT_TRUE(r.blocks());
        EXPECT_EQ(r.world(), static_cast<int>(ranges.size()));
        expect_reads_everything(r, s);
        std::vector<float> w(60);
        r.read_tensor(FlatArray::ExpAvg, "w", w.data());
        EXPECT_TRUE(same_range(w, s[1], 128, 188));
    }
}

TEST(FlatStateReader, Bf16ArraysReadAsTheValuesTheyHold) {
    const FlatArrays s = source(2);
    TempDir d;
    write_blocks(d.str(), s, kTotal, shard_ranges(kTotal, 2), {.store = {DType::F32, DType::BF16, DType::BF16}});
    FlatArrays expected = s;
    for (int a = 1; a < 3; ++a)
        for (float& x : expected[a]) x = round_through(x, DType::BF16);
    const FlatStateReader r(d.str(), layout());
    EXPECT_EQ(r.stored_dtype(FlatArray::Master), DType::F32);
    EXPECT_EQ(r.stored_dtype(FlatArray::ExpAvg), DType::BF16);
    expect_reads_everything(r, expected);
    EXPECT_NE(std::memcmp(expected[1].data(), s[1].data(), kTotal * sizeof(float)), 0) << "bf16 changed nothing";
}

TEST(FlatStateReader, NamedTensorsReadAcrossTensorsWithThePaddingAsZero) {
    const FlatArrays s = source(3);
    TempDir d;
    write_named(d.str(), s, layout(), {DType::F32, DType::F32, DType::BF16});
    FlatArrays expected = s;
    for (float& x : expected[2]) x = round_through(x, DType::BF16);
    const FlatStateReader r(d.str(), layout());
    EXPECT_FALSE(r.blocks());
    EXPECT_EQ(r.world(), 1);
    EXPECT_EQ(r.stored_dtype(FlatArray::ExpAvgSq), DType::BF16);
    expect_reads_everything(r, expected);  // out starts as NaN: the padding is written, as 0
}

TEST(FlatStateReader, BlocksAreCheckedAgainstTheManifestInStateJson) {
    const FlatArrays s = source(4);
    TempDir d;
    write_blocks(d.str(), s, kTotal, shard_ranges(kTotal, 3), {.store = {DType::F32, DType::BF16, DType::F32}});
    const auto manifest = nlohmann::json::parse(block_manifest_json(*open_block_set(d.str())));
    EXPECT_EQ(manifest["world"], 3);
    EXPECT_EQ(manifest["total"], kTotal);
    EXPECT_EQ(manifest["dtypes"]["exp_avg"], "BF16");
    EXPECT_EQ(manifest["blocks"][1]["file"], "block-00001-of-00003.safetensors");
    EXPECT_EQ(manifest["blocks"][1]["begin"], shard_ranges(kTotal, 3)[1].first);
    auto with = [&](const nlohmann::json& shards) {
        write_file(d / "state.json", nlohmann::json{{"format", "x"}, {"shards", shards}}.dump());
    };
    with(manifest);
    EXPECT_NO_THROW(FlatStateReader(d.str(), layout()));
    auto moved = manifest;
    moved["blocks"][1]["end"] = 700;
    with(moved);
    EXPECT_ERROR(FlatStateReader(d.str(), layout()), "state.json", "block-00001-of-00003.safetensors", "[384, 700)");
    auto retyped = manifest;
    retyped["dtypes"]["exp_avg"] = "F32";
    with(retyped);
    EXPECT_ERROR(FlatStateReader(d.str(), layout()), "state.json", "'exp_avg' as F32 but the blocks store it as BF16");
    write_file(d / "state.json", R"({"format": "x"})");  // a checkpoint from before the manifest
    EXPECT_NO_THROW(FlatStateReader(d.str(), layout()));
}

TEST(FlatStateReaderErrors, MissingBlocksAreListedByRank) {
    TempDir d;
    write_blocks(d.str(), source(5), kTotal, shard_ranges(kTotal, 4));
    fs::remove(d / "block-00001-of-00004.safetensors");
    fs::remove(d / "block-00003-of-00004.safetensors");
    EXPECT_ERROR(FlatStateReader(d.str(), layout()), d.str(), "lacks the blocks of ranks 1 and 3 of 4",
                 "block-00001-of-00004.safetensors");
}

TEST(FlatStateReaderErrors, BlocksOfTwoWorldSizesAreRefused) {
    TempDir d;
    write_blocks(d.str(), source(6), kTotal, shard_ranges(kTotal, 2));
    write_blocks(d.str(), source(6), kTotal, shard_ranges(kTotal, 3));
    EXPECT_ERROR(FlatStateReader(d.str(), layout()), "mixes the blocks of 2 and 3 ranks",
                 "block-00000-of-00002.safetensors", "block-00000-of-00003.safetensors");
}

TEST(FlatStateReaderErrors, AFlatSpaceOtherThanTheModelsIsRefused) {
    TempDir d;
    write_blocks(d.str(), source(7), kTotal, shard_ranges(kTotal, 2), {.layout = "0123456789abcdef"});
    EXPECT_ERROR(FlatStateReader(d.str(), layout(1024)), "block-00000-of-00002.safetensors",
                 "has 1001 elements, this model's 1024");
    EXPECT_ERROR(FlatStateReader(d.str(), layout()), "block-00000-of-00002.safetensors",
                 "written in flat layout 0123456789abcdef, this model's is " + layout().fingerprint());
    // ranks that disagree about the space
    TempDir e;
    write_blocks(e.str(), source(7), kTotal, shard_ranges(kTotal, 2), {.edit_meta = [](BlockMeta& m) {
                     if (m.rank == 1) m.total = kTotal + 1, m.end = kTotal + 1;
                 }});
    EXPECT_ERROR(FlatStateReader(e.str(), layout()), "block-00001-of-00002.safetensors", "has 1002 elements",
                 "block-00000-of-00002.safetensors's 1001");
}

TEST(FlatStateReaderErrors, BlocksMustTileTheFlatSpaceInRankOrder) {
    const FlatArrays s = source(8);
    const std::vector<std::pair<Ranges, std::vector<std::string>>> cases = {
        {{{0, 500}, {510, kTotal}}, {"block-00001-of-00002.safetensors", "begins at element 510",
                                     "block-00000-of-00002.safetensors's ends at 500"}},
        {{{0, 500}, {490, kTotal}}, {"block-00001-of-00002.safetensors", "begins at element 490"}},
        {{{10, 500}, {500, kTotal}}, {"block-00000-of-00002.safetensors", "the first block begins at element 10"}},
        {{{0, 500}, {500, 1000}}, {"block-00001-of-00002.safetensors", "ends at element 1000, not at", "1001"}},
    };
    for (const auto& [ranges, parts] : cases) {
        TempDir d;
        write_blocks(d.str(), s, kTotal, ranges);
        const std::string m = EXPECT_ERROR(FlatStateReader(d.str(), layout()));
        for (const auto& p : parts) EXPECT_TRUE(Contains(m, p)) << p;
    }
}

TEST(FlatStateReaderErrors, PiecesOfTheWrongSizeOrTypeAreRefused) {
    const FlatArrays s = source(9);
    TempDir d;
    write_blocks(d.str(), s, kTotal, shard_ranges(kTotal, 2), {.piece = 100, .written_piece = 50});
    EXPECT_ERROR(FlatStateReader(d.str(), layout()), "block-00000-of-00002.safetensors",
                 "piece 'master.0' has 50 elements but the block's pieces hold 100");
    // one rank's moments in bf16, the other's in fp32
    TempDir a, b;
    write_blocks(a.str(), s, kTotal, shard_ranges(kTotal, 2));
    write_blocks(b.str(), s, kTotal, shard_ranges(kTotal, 2), {.store = {DType::F32, DType::BF16, DType::F32}});
    fs::copy_file(b / "block-00001-of-00002.safetensors", a / "block-00001-of-00002.safetensors",
                  fs::copy_options::overwrite_existing);
    EXPECT_ERROR(FlatStateReader(a.str(), layout()), "block-00001-of-00002.safetensors",
                 "'exp_avg' is stored as BF16 but as F32 in", "block-00000-of-00002.safetensors");
}

TEST(FlatStateReaderErrors, MetadataThatContradictsTheFileNameIsRefused) {
    TempDir d;
    write_blocks(d.str(), source(10), kTotal, shard_ranges(kTotal, 2), {.edit_meta = [](BlockMeta& m) {
                     if (m.rank == 1) m.rank = 0;
                 }});
    EXPECT_ERROR(FlatStateReader(d.str(), layout()), "block-00001-of-00002.safetensors",
                 "its metadata says rank 0 of 2, its name rank 1 of 2");
}

TEST(FlatStateReaderErrors, NonFiniteValuesNameTheFileAndPiece) {
    FlatArrays s = source(11);
    s[2][700] = std::numeric_limits<float>::infinity();
    TempDir d;
    write_blocks(d.str(), s, kTotal, shard_ranges(kTotal, 2));
    const FlatStateReader r(d.str(), layout());
    std::vector<float> out(200);
    EXPECT_NO_THROW(r.read(FlatArray::ExpAvgSq, 0, 200, out.data()));
    // 700 = block 1 (from 512), piece 1 (from 612), element 88
    EXPECT_ERROR(r.read(FlatArray::ExpAvgSq, 600, 800, out.data()), "block-00001-of-00002.safetensors",
                 "'exp_avg_sq.1'", "non-finite", "element 88");
    EXPECT_ERROR(r.read(FlatArray::Master, 0, kTotal + 1, out.data()), "elements [0, 1002) asked for",
                 "the flat space has 1001");
}

TEST(FlatStateReaderErrors, WhatIsNeitherFormatIsNamed) {
    const FlatArrays s = source(12);
    {
        TempDir d;
        EXPECT_ERROR(FlatStateReader(d.str(), layout()), "holds neither blocks", "model.safetensors");
        write_file(d / "block-notes.txt", "x");
        EXPECT_ERROR(FlatStateReader(d.str(), layout()), "block-notes.txt", "not a block file name");
    }
    {
        TempDir d;
        write_named(d.str(), s, layout());
        fs::remove(d / "optimizer.safetensors");
        EXPECT_ERROR(FlatStateReader(d.str(), layout()), "holds model.safetensors but no optimizer.safetensors");
    }
    {
        TempDir d;
        FlatLayout fewer = layout();
        fewer.tensors.erase(fewer.tensors.begin() + 3);  // no "bias"
        write_named(d.str(), s, fewer);
        EXPECT_ERROR(FlatStateReader(d.str(), layout()), "tensor 'bias' is missing from",
                     d / "model.safetensors");
        FlatLayout reshaped = layout();
        reshaped.tensors[2].shape = {3, 5, 4};
        EXPECT_ERROR(FlatStateReader(d.str(), reshaped), "model.safetensors", "tensor 'w' has shape [5, 3, 4]",
                     "this model's is [3, 5, 4]");
        write_blocks(d.str(), s, kTotal, shard_ranges(kTotal, 2));
        EXPECT_ERROR(FlatStateReader(d.str(), fewer), "holds both blocks", "model.safetensors");
    }
    FlatLayout overlapping = layout();
    overlapping.tensors[1].offset = 60;  // inside "embed"
    EXPECT_ERROR(FlatStateReader("/nonexistent", overlapping), "tensor 'norm' at element 60 overlaps");
}
