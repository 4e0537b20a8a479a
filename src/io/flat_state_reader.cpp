#include "io/flat_state_reader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "io/safetensors.h"

namespace qtrain {

namespace fs = std::filesystem;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
// where train/checkpointer.h records the manifest ("shards") of the checkpoint's blocks
constexpr const char* kStateFile = "state.json";

std::string shape_text(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

std::string named_key(const std::string& tensor, FlatArray a) {
    return a == FlatArray::Master ? tensor : tensor + "." + flat_array_name(a);
}

}  // namespace

bool holds_block_files(const std::string& dir) { return !list_block_like_files(dir).empty(); }

FlatStateReader::~FlatStateReader() = default;

FlatStateReader::FlatStateReader(const std::string& dir, FlatLayout layout) : dir_(dir), layout_(std::move(layout)) {
    layout_.check("the flat layout of checkpoint '" + dir + "'");
    for (std::size_t i = 0; i < layout_.tensors.size(); ++i) index_.emplace(layout_.tensors[i].name, i);
    const fs::path model_path = fs::path(dir) / kModelFile, opt_path = fs::path(dir) / kOptimizerFile;
    const bool has_model = fs::exists(model_path), has_opt = fs::exists(opt_path);
    blocks_ = open_block_set(dir);
    if (blocks_) {
        QT_CHECK(!has_model && !has_opt, "checkpoint '", dir, "' holds both blocks (", blocks_->path(0), ", ...) and ",
                 has_model ? kModelFile : kOptimizerFile, ": one writer writes one format; restore the checkpoint");
        QT_CHECK(blocks_->total == layout_.total, blocks_->path(0), ": the blocks' flat space has ", blocks_->total,
                 " elements, this model's ", layout_.total, " (a checkpoint of another model?)");
        const std::string& fp = blocks_->blocks.front().layout;
        QT_CHECK(fp.empty() || fp == layout_.fingerprint(), blocks_->path(0), ": written in flat layout ", fp,
                 ", this model's is ", layout_.fingerprint(),
                 " (the same number of elements, placed otherwise: another model, or a layout of another qtrain version)");
        const fs::path state = fs::path(dir) / kStateFile;
        if (fs::exists(state)) check_block_manifest(*blocks_, read_text_file(state.string()), state.string());
        return;
    }
    QT_CHECK(has_model && has_opt, "checkpoint '", dir, "' holds ",
             has_model ? cat(kModelFile, " but no ", kOptimizerFile)
             : has_opt ? cat(kOptimizerFile, " but no ", kModelFile)
                       : cat("neither blocks (", block_file_name(0, 2), ", ...) nor ", kModelFile, " and ",
                             kOptimizerFile),
             " (not a qtrain checkpoint, or an incomplete copy)");
    model_file_ = std::make_unique<SafeTensorsFile>(model_path.string());
    optimizer_file_ = std::make_unique<SafeTensorsFile>(opt_path.string());
    std::unordered_map<std::string, const SafeTensorInfo*> in_model, in_opt;
    for (const SafeTensorInfo& t : model_file_->tensors()) in_model.emplace(t.name, &t);
    for (const SafeTensorInfo& t : optimizer_file_->tensors()) in_opt.emplace(t.name, &t);
    for (const FlatTensor& t : layout_.tensors) {
        std::array<const SafeTensorInfo*, 3> where{};
        for (int a = 0; a < 3; ++a) {
            const bool master = kFlatArrays[a] == FlatArray::Master;
            const SafeTensorsFile& f = master ? *model_file_ : *optimizer_file_;
            const std::string key = named_key(t.name, kFlatArrays[a]);
            const auto& in = master ? in_model : in_opt;
            auto it = in.find(key);
            QT_CHECK(it != in.end(), "checkpoint '", dir, "': tensor '", key, "' is missing from '", f.path(), "'");
            QT_CHECK(it->second->shape == t.shape, f.path(), ": tensor '", key, "' has shape ",
                     shape_text(it->second->shape), " but this model's is ", shape_text(t.shape));
            where[a] = it->second;
        }
        named_.push_back(where);
    }
}

void FlatStateReader::read(FlatArray array, int64_t begin, int64_t end, float* out) const {
    QT_CHECK(0 <= begin && begin <= end && end <= layout_.total, "checkpoint '", dir_, "': elements [", begin, ", ",
             end, ") asked for, but the flat space has ", layout_.total);
    if (begin == end) return;
    if (blocks_) read_blocks(array, begin, end, out);
    else read_named(array, begin, end, out);
}

void FlatStateReader::read_tensor(FlatArray array, const std::string& name, float* out) const {
    auto it = index_.find(name);
    QT_CHECK(it != index_.end(), "checkpoint '", dir_, "': the flat layout has no tensor '", name, "'");
    const FlatTensor& t = layout_.tensors[it->second];
    read(array, t.offset, t.offset + t.numel(), out);
}

// The blocks tile [0, total) in rank order, so the ones [begin, end) overlaps are consecutive; within
// a block only the pieces the range overlaps are touched, each converted into its place in `out`.
void FlatStateReader::read_blocks(FlatArray array, int64_t begin, int64_t end, float* out) const {
    const auto& blocks = blocks_->blocks;
    const char* name = flat_array_name(array);
    auto b = std::partition_point(blocks.begin(), blocks.end(), [&](const BlockMeta& m) { return m.end <= begin; });
    for (; b != blocks.end() && b->begin < end; ++b) {
        const int64_t lo = std::max(begin, b->begin), hi = std::min(end, b->end);
        if (lo >= hi) continue;  // an empty block (a rank with no elements)
        const SafeTensorsFile& f = *blocks_->files[b - blocks.begin()];
        for (int64_t p = (lo - b->begin) / b->piece; b->begin + p * b->piece < hi; ++p) {
            const int64_t start = b->begin + p * b->piece;
            const int64_t plo = std::max(lo, start), phi = std::min(hi, start + b->piece);
            const SafeTensorInfo* piece = f.find(block_piece_name(name, p));  // checked when opened
            f.read_finite_f32(*piece, plo - start, phi - plo, out + (plo - begin));
        }
    }
}

// The tensors in offset order, the padding between them (never trained) as 0.
void FlatStateReader::read_named(FlatArray array, int64_t begin, int64_t end, float* out) const {
    const auto& ts = layout_.tensors;
    const int a = static_cast<int>(array);
    const SafeTensorsFile& f = array == FlatArray::Master ? *model_file_ : *optimizer_file_;
    auto t = std::partition_point(ts.begin(), ts.end(), [&](const FlatTensor& x) { return x.offset + x.numel() <= begin; });
    int64_t at = begin;  // out is filled up to here
    for (; t != ts.end() && t->offset < end; ++t) {
        const int64_t lo = std::max(begin, t->offset), hi = std::min(end, t->offset + t->numel());
        if (lo >= hi) continue;  // an empty tensor
        std::fill(out + (at - begin), out + (lo - begin), 0.0f);
        f.read_finite_f32(*named_[t - ts.begin()][a], lo - t->offset, hi - lo, out + (lo - begin));
        at = hi;
    }
    std::fill(out + (at - begin), out + (end - begin), 0.0f);
}

DType FlatStateReader::stored_dtype(FlatArray array) const {
    const int a = static_cast<int>(array);
    if (blocks_) return blocks_->dtypes[a];
    return named_.empty() ? DType::F32 : named_.front()[a]->dtype;
}

std::string FlatStateReader::describe() const {
    if (blocks_)
        return cat(blocks_->world, " block", blocks_->world == 1 ? "" : "s", " (", block_file_name(0, blocks_->world),
                   blocks_->world > 1 ? ", ..." : "", ")");
    return cat(kModelFile, " and ", kOptimizerFile);
}

}  // namespace qtrain
