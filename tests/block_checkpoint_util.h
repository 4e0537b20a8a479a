// Checkpoints in the block format for tests, written with the real format (io/block_format.h,
// SafeTensorsWriter) but without a GPU: flat arrays cut into the blocks of any partition of the flat
// space, as the GPU model's ranks write them, and the same state as named tensors. They are made from
// plain vectors and read back here with SafeTensorsReader only, so what they check of FlatStateReader
// does not depend on FlatStateReader.
#pragma once

#include <array>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/checksum.h"
#include "core/dtype.h"
#include "io/block_format.h"
#include "io/block_set.h"
#include "io/flat_layout.h"
#include "io/safetensors.h"
#include "model/cuda/param_shard.h"
#include "test_util.h"

namespace qtrain::test {

// master, exp_avg, exp_avg_sq over the whole flat space (FlatArray order)
using FlatArrays = std::array<std::vector<float>, 3>;
using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// The GPU model's partition of `total` elements over `world` ranks (model/cuda/param_shard.h).
inline Ranges shard_ranges(int64_t total, int world) {
    Ranges r;
    for (int k = 0; k < world; ++k) {
        const ParamShard s = param_shard(total, world, k);
        r.emplace_back(s.begin, s.end);
    }
    return r;
}

struct BlockWriteOptions {
    int64_t piece = 100;  // elements per piece, as recorded in the metadata
    std::array<DType, 3> store{DType::F32, DType::F32, DType::F32};
    std::string layout;   // the fingerprint to record ("": none, as before resharding)
    int zero_level = 1;
    // to damage a block: pieces written this long instead (0: `piece`), and the metadata edited
    int64_t written_piece = 0;
    std::function<void(BlockMeta&)> edit_meta;
};

// Rank k of ranges.size() writes block_file_name(k, W) holding [ranges[k].first, ranges[k].second).
inline void write_blocks(const std::string& dir, const FlatArrays& s, int64_t total, const Ranges& ranges,
                         const BlockWriteOptions& o = {}) {
    std::filesystem::create_directories(dir);
    const int world = static_cast<int>(ranges.size());
    const int64_t piece = o.written_piece > 0 ? o.written_piece : o.piece;
    for (int k = 0; k < world; ++k) {
        const auto [begin, end] = ranges[k];
        SafeTensorsWriter w;
        for (int a = 0; a < 3; ++a)
            for (int64_t p = 0; p * piece < end - begin; ++p) {
                const int64_t len = std::min(piece, end - begin - p * piece);
                w.add_f32(block_piece_name(flat_array_name(kFlatArrays[a]), p), {len}, s[a].data() + begin + p * piece,
                          o.store[a]);
            }
        BlockMeta m;
        m.rank = k;
        m.world = world;
        m.begin = begin;
        m.end = end;
        m.total = total;
        m.piece = o.piece;
        m.zero_level = o.zero_level;
        m.layout = o.layout;
        if (o.edit_meta) o.edit_meta(m);
        write_block_meta(w, m);
        w.write((std::filesystem::path(dir) / block_file_name(k, world)).string());
    }
}

// The same state as a named checkpoint: model.safetensors (master) and optimizer.safetensors.
inline void write_named(const std::string& dir, const FlatArrays& s, const FlatLayout& layout,
                        std::array<DType, 3> store = {DType::F32, DType::F32, DType::F32}) {
    std::filesystem::create_directories(dir);
    SafeTensorsWriter model, optimizer;
    for (const FlatTensor& t : layout.tensors) {
        model.add_f32(t.name, t.shape, s[0].data() + t.offset, store[0]);
        optimizer.add_f32(t.name + ".exp_avg", t.shape, s[1].data() + t.offset, store[1]);
        optimizer.add_f32(t.name + ".exp_avg_sq", t.shape, s[2].data() + t.offset, store[2]);
    }
    model.write(dir + "/model.safetensors");
    optimizer.write(dir + "/optimizer.safetensors");
}

// A named checkpoint's state placed in `layout` (the padding 0).
inline FlatArrays flat_arrays_of_named(const std::string& dir, const FlatLayout& layout) {
    SafeTensorsReader model({dir + "/model.safetensors"}), optimizer({dir + "/optimizer.safetensors"});
    FlatArrays s;
    for (auto& v : s) v.assign(static_cast<std::size_t>(layout.total), 0.0f);
    for (const FlatTensor& t : layout.tensors) {
        model.read_f32(t.name, t.shape, s[0].data() + t.offset);
        optimizer.read_f32(t.name + ".exp_avg", t.shape, s[1].data() + t.offset);
        optimizer.read_f32(t.name + ".exp_avg_sq", t.shape, s[2].data() + t.offset);
    }
    return s;
}

// Rewrites a checkpoint's state.json after its files were replaced: "files" (sizes and checksums of
// every other file, as the checkpointer records them) and, for blocks, the "shards" manifest.
inline void refresh_state_json(const std::string& dir, bool with_shards = true) {
    namespace fs = std::filesystem;
    auto j = nlohmann::json::parse(read_file(dir + "/state.json"));
    nlohmann::json files = nlohmann::json::object();
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (name == "state.json") continue;
        const FileChecksum c = checksum_file(e.path().string());
        files[name] = {{"bytes", c.bytes}, {"xxh3_64", checksum_hex(c.xxh3)}};
    }
    j["files"] = files;
    j.erase("shards");
    if (with_shards)
        if (const auto blocks = open_block_set(dir)) j["shards"] = nlohmann::json::parse(block_manifest_json(*blocks));
    write_file(dir + "/state.json", j.dump(2));
}

}  // namespace qtrain::test
