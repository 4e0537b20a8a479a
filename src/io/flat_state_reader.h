// Reads any range of a checkpoint's flat optimizer state (master, exp_avg, exp_avg_sq over the flat
// space of flat_layout.h) as fp32, whatever wrote it:
//  - block files of any world size (block_format.h, the GPU model at --gpus=N > 1): the range is
//    assembled from the pieces of the blocks it overlaps, each converted straight into the caller's
//    buffer, so nothing but that buffer is held and a rank reading its block at the world size that
//    wrote it reads exactly its own file's pieces, once;
//  - named tensors (model.safetensors + optimizer.safetensors: the CPU model, the GPU model at one
//    rank): the tensors the range crosses, the padding between them read as 0.
// This is resharding on load: a checkpoint of W ranks resumes at W' (each rank reading its block
// [begin, end) of the W' partition) with no conversion step. Values are converted to fp32 from the
// stored dtype (fp32 or bf16); a NaN or Inf is an error naming the file and tensor. Everything that can
// be checked without reading elements is checked when the reader is made (block_set.h; for named
// tensors: each of the layout's tensors present with its shape), so a bad checkpoint fails before a
// model has loaded half of it. Checksums are the checkpointer's (verified before any model loads).
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/block_set.h"
#include "io/flat_layout.h"

namespace qtrain {

class FlatStateReader {
public:
    // `layout`: the flat space of the model that reads (its total must match the blocks'; its
    // fingerprint too where the blocks recorded one). Throws naming the directory or file.
    FlatStateReader(const std::string& dir, FlatLayout layout);
    ~FlatStateReader();
    FlatStateReader(const FlatStateReader&) = delete;
    FlatStateReader& operator=(const FlatStateReader&) = delete;

    // out[0, end - begin) = elements [begin, end) of `array`, 0 <= begin <= end <= layout total.
    void read(FlatArray array, int64_t begin, int64_t end, float* out) const;
    // One tensor of the layout, by name (numel() elements).
    void read_tensor(FlatArray array, const std::string& name, float* out) const;

    bool blocks() const { return blocks_.has_value(); }
    int world() const { return blocks_ ? blocks_->world : 1; }  // ranks that wrote the blocks
    DType stored_dtype(FlatArray array) const;
    const FlatLayout& layout() const { return layout_; }
    // "4 blocks (block-*-of-00004.safetensors)" or "model.safetensors + optimizer.safetensors", for messages.
    std::string describe() const;

private:
    void read_blocks(FlatArray array, int64_t begin, int64_t end, float* out) const;
    void read_named(FlatArray array, int64_t begin, int64_t end, float* out) const;

    std::string dir_;
    FlatLayout layout_;
    std::unordered_map<std::string, std::size_t> index_;  // tensor name -> layout_.tensors index
    std::optional<BlockSet> blocks_;
    // named tensors: model.safetensors (master), optimizer.safetensors (the moments); for each layout
    // tensor and array, where it is
    std::unique_ptr<SafeTensorsFile> model_file_, optimizer_file_;
    std::vector<std::array<const SafeTensorInfo*, 3>> named_;
};

// Whether `dir` holds block files (of any world size), without opening them.
bool holds_block_files(const std::string& dir);

}  // namespace qtrain
