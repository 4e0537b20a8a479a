// The block checkpoint format: how a data-parallel rank stores its block [begin, end) of the flat
// space (flat_layout.h) — the GPU model's ranks write it (CudaModel::save_block_checkpoint), the flat
// state reader reads it at any world size (flat_state_reader.h). One place for its names, so the
// writer, the reader and the tests cannot drift apart.
//
// Rank r of W writes `block-RRRRR-of-WWWWW.safetensors` (5 digits each) holding, for each array of
// flat_layout.h's FlatArray, the block's elements as 1-D pieces "<array>.0", "<array>.1", ... of
// `piece` elements (the last one shorter), in the array's dtype (fp32 or bf16). Pieces bound what a
// writer or reader holds in host memory (a 7B model's block on 2 ranks is 3.5G elements). The
// safetensors metadata says which block it is (BlockMeta).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qtrain {

class SafeTensorsFile;
class SafeTensorsWriter;

inline constexpr const char* kBlockFormat = "qtrain data-parallel block";  // metadata "format"
inline constexpr int64_t kBlockPieceElements = int64_t{1} << 26;          // what the GPU model writes

std::string block_file_name(int rank, int world);
// (rank, world) of a name block_file_name makes; nullopt for any other name.
std::optional<std::pair<int, int>> parse_block_file_name(std::string_view name);
// "<array>.<piece>"
std::string block_piece_name(std::string_view array, int64_t piece);
// Pieces of `piece` elements a block of `elements` is cut into.
int64_t block_piece_count(int64_t elements, int64_t piece);

// The metadata of a block file. The first six keys are in every block qtrain wrote; piece_elements,
// zero_level and layout were added with resharding (files without them read with the defaults).
struct BlockMeta {
    int rank = 0, world = 1;
    int64_t begin = 0, end = 0;  // the block's elements of the flat space
    int64_t total = 0;           // elements of the whole flat space
    int64_t piece = kBlockPieceElements;
    int zero_level = 0;          // 0: not recorded
    std::string layout;          // FlatLayout::fingerprint() of the space; empty: not recorded
    int64_t count() const { return end - begin; }
};
void write_block_meta(SafeTensorsWriter& w, const BlockMeta& meta);
// Throws naming the file and the key for a missing or malformed key, or another format.
BlockMeta read_block_meta(const SafeTensorsFile& f);

// The names of the files in `dir` that look like blocks ("block-*"), sorted; whether they parse is
// for the caller to check (a stray "block-x" is an error there, not silently skipped).
std::vector<std::string> list_block_like_files(const std::string& dir);

}  // namespace qtrain
