// All the block files of one checkpoint (block_format.h), opened and checked as a whole before any
// element is read: one world size, every rank's file, blocks that tile [0, total) in rank order, and
// every piece where its block says it is. Also the checkpoint manifest's "shards" entry
// (docs/design.md, "Checkpoints"): what rank 0 records in state.json after every rank has written its
// block (train/checkpointer.h), and what the reader checks the files against when it is there.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/block_format.h"
#include "io/flat_layout.h"
#include "io/safetensors.h"

namespace qtrain {

struct BlockSet {
    std::string dir;
    int world = 0;
    int64_t total = 0;
    std::vector<BlockMeta> blocks;                      // by rank; blocks[r] tiles [begin, end)
    std::vector<std::unique_ptr<SafeTensorsFile>> files;  // by rank
    std::array<DType, 3> dtypes{};                      // each array's stored dtype (the same in every block)

    std::string path(int rank) const;
};

// Opens the blocks in `dir`; nullopt when it has no "block-*" file. Throws naming the directory or
// the file: names that are not block_file_name's, blocks of two world sizes, missing ranks (listed),
// metadata that disagrees with the file name or another block (rank, world, total, piece size,
// layout), ranges that leave a gap or overlap, pieces missing, of the wrong length or not a floating
// type, an array stored in different dtypes by different ranks.
std::optional<BlockSet> open_block_set(const std::string& dir);

// The manifest entry of a block set, as a JSON object (text):
//   {"format": "qtrain data-parallel block", "world": W, "total": T, "piece_elements": P,
//    "zero_level": Z, "layout": "<fingerprint>",
//    "dtypes": {"master": "F32", "exp_avg": "BF16", "exp_avg_sq": "F32"},
//    "blocks": [{"file": "block-00000-of-00002.safetensors", "rank": 0, "begin": 0, "end": E}, ...]}
// (zero_level and layout only where the blocks recorded them).
std::string block_manifest_json(const BlockSet& set);
// The blocks against the "shards" entry of `state_json` (the text of state.json at `state_path`),
// if it has one: same world, total and dtypes, and each listed file with its rank and range. Throws
// naming state_path and the file; returns false (nothing checked) when there is no "shards".
bool check_block_manifest(const BlockSet& set, const std::string& state_json, const std::string& state_path);

}  // namespace qtrain
