#include "io/block_set.h"

#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace qtrain {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

namespace {

// "1, 3 and 4" (at most 8, then "...").
std::string list_ranks(const std::vector<int>& ranks) {
    std::string s;
    for (std::size_t i = 0; i < ranks.size() && i < 8; ++i)
        s += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
    return ranks.size() > 8 ? s + ", ... (" + std::to_string(ranks.size()) + " ranks)" : s;
}

// Every piece of each array where the block says it is, of one floating dtype per array.
void check_pieces(const SafeTensorsFile& f, const BlockMeta& m, std::array<std::optional<DType>, 3>& dtype) {
    const int64_t pieces = block_piece_count(m.count(), m.piece);
    for (int a = 0; a < 3; ++a) {
        const char* array = flat_array_name(kFlatArrays[a]);
        for (int64_t p = 0; p < pieces; ++p) {
            const std::string name = block_piece_name(array, p);
            const SafeTensorInfo* t = f.find(name);
            const int64_t len = std::min(m.piece, m.count() - p * m.piece);
            QT_CHECK(t, f.path(), ": no piece '", name, "' (its block of ", m.count(), " elements is ", pieces,
                     " pieces of ", m.piece, " per array)");
            QT_CHECK(t->shape == std::vector<int64_t>{len}, f.path(), ": piece '", name, "' has ",
                     t->shape.size() == 1 ? std::to_string(t->shape[0]) + " elements"
                                          : std::to_string(t->shape.size()) + " dimensions",
                     " but the block's pieces hold ", len, " (", m.count(), " elements in pieces of ", m.piece, ")");
            QT_CHECK(t->dtype == DType::F32 || t->dtype == DType::BF16 || t->dtype == DType::F16, f.path(),
                     ": piece '", name, "' is ", safetensors_dtype_name(t->dtype), ", expected F32 or BF16");
            QT_CHECK(!dtype[a] || *dtype[a] == t->dtype, f.path(), ": piece '", name, "' is stored as ",
                     safetensors_dtype_name(t->dtype), " but other pieces of '", array, "' as ",
                     safetensors_dtype_name(*dtype[a]));
            dtype[a] = t->dtype;
        }
    }
    if (static_cast<int64_t>(f.tensors().size()) == 3 * pieces) return;  // and each expected one is there
    for (const SafeTensorInfo& t : f.tensors()) {
        bool expected = false;
        for (int a = 0; a < 3 && !expected; ++a)
            for (int64_t p = 0; p < pieces && !expected; ++p)
                expected = t.name == block_piece_name(flat_array_name(kFlatArrays[a]), p);
        QT_CHECK(expected, f.path(), ": holds '", t.name, "', which is not one of the block's ", 3 * pieces,
                 " pieces (", m.count(), " elements in pieces of ", m.piece, " per array)");
    }
}

}  // namespace

std::string BlockSet::path(int rank) const { return (fs::path(dir) / block_file_name(rank, world)).string(); }

std::optional<BlockSet> open_block_set(const std::string& dir) {
    const std::vector<std::string> names = list_block_like_files(dir);
    if (names.empty()) return std::nullopt;
    BlockSet set;
    set.dir = dir;
    std::map<int, std::string> first_of_world;  // world -> a file name of it
    for (const std::string& name : names) {
        const auto parsed = parse_block_file_name(name);
        QT_CHECK(parsed, (fs::path(dir) / name).string(), ": not a block file name (",
                 block_file_name(0, 2), " and so on); remove it or restore the checkpoint");
        first_of_world.emplace(parsed->second, name);
    }
    if (first_of_world.size() > 1) {
        auto a = first_of_world.begin(), b = std::next(a);
        throw_error(cat("checkpoint '", dir, "' mixes the blocks of ", a->first, " and ", b->first, " ranks (", a->second,
                        ", ", b->second, "): two runs wrote into one directory, or files were copied in; keep the "
                        "blocks of one world size"));
    }
    set.world = first_of_world.begin()->first;
    std::vector<int> missing;
    for (int r = 0; r < set.world; ++r)
        if (!fs::exists(set.path(r))) missing.push_back(r);
    QT_CHECK(missing.empty(), "checkpoint '", dir, "' lacks the block", missing.size() == 1 ? "" : "s", " of rank",
             missing.size() == 1 ? " " : "s ", list_ranks(missing), " of ", set.world, " (",
             block_file_name(missing.front(), set.world), missing.size() > 1 ? ", ..." : "",
             "): every rank's block is needed to read the flat space");

    std::array<std::optional<DType>, 3> dtype;
    std::array<int, 3> dtype_rank{};
    for (int r = 0; r < set.world; ++r) {
        auto f = std::make_unique<SafeTensorsFile>(set.path(r));
        const BlockMeta m = read_block_meta(*f);
        QT_CHECK(m.rank == r && m.world == set.world, f->path(), ": its metadata says rank ", m.rank, " of ", m.world,
                 ", its name rank ", r, " of ", set.world, " (renamed?)");
        if (r == 0) {
            set.total = m.total;
            QT_CHECK(m.begin == 0, f->path(), ": the first block begins at element ", m.begin,
                     ", not 0: the blocks must tile the flat space [0, total) in rank order");
        } else {
            const BlockMeta& first = set.blocks.front();
            const BlockMeta& prev = set.blocks.back();
            QT_CHECK(m.total == first.total, f->path(), ": its flat space has ", m.total, " elements, ",
                     set.path(0), "'s ", first.total, " (blocks of two models or runs?)");
            QT_CHECK(m.piece == first.piece, f->path(), ": pieces of ", m.piece, " elements, ", set.path(0), "'s of ",
                     first.piece);
            QT_CHECK(m.layout == first.layout, f->path(), ": written in flat layout '", m.layout, "', ", set.path(0),
                     " in '", first.layout, "' (blocks of two models or qtrain versions?)");
            QT_CHECK(m.begin == prev.end, f->path(), ": the block begins at element ", m.begin, " but ",
                     set.path(r - 1), "'s ends at ", prev.end,
                     ": the blocks must tile the flat space [0, total) in rank order, without gaps or overlaps");
        }
        std::array<std::optional<DType>, 3> mine;
        check_pieces(*f, m, mine);
        for (int a = 0; a < 3; ++a) {
            if (!mine[a]) continue;
            QT_CHECK(!dtype[a] || *dtype[a] == *mine[a], f->path(), ": '", flat_array_name(kFlatArrays[a]),
                     "' is stored as ", safetensors_dtype_name(*mine[a]), " but as ", safetensors_dtype_name(*dtype[a]),
                     " in ", set.path(dtype_rank[a]));
            if (!dtype[a]) dtype[a] = mine[a], dtype_rank[a] = r;
        }
        set.blocks.push_back(m);
        set.files.push_back(std::move(f));
    }
    QT_CHECK(set.blocks.back().end == set.total, set.path(set.world - 1), ": the last block ends at element ",
             set.blocks.back().end, ", not at the flat space's total of ", set.total);
    for (int a = 0; a < 3; ++a) set.dtypes[a] = dtype[a].value_or(DType::F32);  // (no elements at all)
    return set;
}

std::string block_manifest_json(const BlockSet& set) {
    const BlockMeta& first = set.blocks.front();
    ordered_json j;
    j["format"] = kBlockFormat;
    j["world"] = set.world;
    j["total"] = set.total;
    j["piece_elements"] = first.piece;
    if (first.zero_level > 0) j["zero_level"] = first.zero_level;
    if (!first.layout.empty()) j["layout"] = first.layout;
    ordered_json dtypes = ordered_json::object();
    for (int a = 0; a < 3; ++a) dtypes[flat_array_name(kFlatArrays[a])] = safetensors_dtype_name(set.dtypes[a]);
    j["dtypes"] = dtypes;
    j["blocks"] = ordered_json::array();
    for (const BlockMeta& m : set.blocks)
        j["blocks"].push_back(
            {{"file", block_file_name(m.rank, m.world)}, {"rank", m.rank}, {"begin", m.begin}, {"end", m.end}});
    return j.dump();
}

bool check_block_manifest(const BlockSet& set, const std::string& state_json, const std::string& state_path) {
    nlohmann::json state;
    try {
        state = nlohmann::json::parse(state_json);
    } catch (const nlohmann::json::exception& e) {
        throw_error(cat(state_path, ": not valid JSON (", e.what(), ")"));
    }
    if (!state.is_object() || !state.contains("shards")) return false;
    try {
        const auto& s = state.at("shards");
        const int world = s.at("world").get<int>();
        const int64_t total = s.at("total").get<int64_t>();
        QT_CHECK(world == set.world && total == set.total, state_path, ": its shards are ", world,
                 " blocks of a ", total, "-element flat space, but '", set.dir, "' holds ", set.world, " of ",
                 set.total);
        for (int a = 0; a < 3; ++a) {
            const char* array = flat_array_name(kFlatArrays[a]);
            const std::string recorded = s.at("dtypes").at(array).get<std::string>();
            QT_CHECK(recorded == safetensors_dtype_name(set.dtypes[a]), state_path, ": its shards record '", array,
                     "' as ", recorded, " but the blocks store it as ", safetensors_dtype_name(set.dtypes[a]));
        }
        const auto& blocks = s.at("blocks");
        QT_CHECK(blocks.is_array() && static_cast<int>(blocks.size()) == set.world, state_path, ": its shards list ",
                 blocks.size(), " blocks for a world of ", world);
        for (int r = 0; r < set.world; ++r) {
            const auto& b = blocks.at(r);
            const BlockMeta& m = set.blocks[r];
            const std::string file = b.at("file").get<std::string>();
            const int rank = b.at("rank").get<int>();
            const int64_t begin = b.at("begin").get<int64_t>(), end = b.at("end").get<int64_t>();
            QT_CHECK(file == block_file_name(r, set.world) && rank == r && begin == m.begin && end == m.end,
                     state_path, ": its shards record ", file, " as rank ", rank, " with [", begin, ", ", end,
                     "), but ", set.path(r), " is rank ", r, " with [", m.begin, ", ", m.end, ")");
        }
    } catch (const nlohmann::json::exception& e) {
        throw_error(cat(state_path, ": malformed \"shards\" (", e.what(), ")"));
    }
    return true;
}

}  // namespace qtrain
