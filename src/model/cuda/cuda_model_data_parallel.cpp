// The GPU model as one rank of a data-parallel world (ZeRO-1/2, cuda_model.h set_communicator): the
// collectives of the optimizer step and the block checkpoints.
//
// Each rank owns the block [begin, end) of the flat parameter space (param_shard.h): its fp32 master
// and Adam's moments hold that block only. The step: the gradients are summed over the ranks in rank
// order (comm/communicator.h) by the gradient role (gradients.h, reduce_over_ranks) — ZeRO-1
// all-reduces the whole gradient in place after the backward; ZeRO-2's per-layer reductions have
// already summed the rank's block during the backward (with CUDA graphs: one reduce-scatter into the
// block instead) — then each rank's partial sums of squares of its block are gathered and summed in
// one order, so every rank gets the same norm and clip factor; AdamW updates the block; the updated weights are all-gathered in place. At world 1 every
// collective is the identity and the arithmetic is the plain path's, so it gives the same bits.
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "io/block_format.h"
#include "io/flat_state_reader.h"
#include "io/safetensors.h"
#include "model/checkpoint_layout.h"
#include "model/cuda/cuda_model.h"
#include "model/flag_names.h"

namespace qtrain {

namespace fs = std::filesystem;

void CudaModel::set_communicator(comm::Communicator* comm, int zero_level) {
    QT_CHECK(comm, "GPU model: set_communicator without a communicator");
    QT_CHECK(zero_level >= 1 && zero_level <= 3, flag(RunFlag::ZeroLevel), "=", zero_level, ": 1, 2 or 3");
    QT_CHECK(comm->world() == std::max(1, opt_.gpus), "GPU model: planned for ", flag(&ModelOptions::gpus), "=",
             opt_.gpus, " but the communicator has ", comm->world(), " ranks");
    if (lora_) {
        // LoRA: ZeRO-1/2 of the adapters (lora_adapters.h: each rank keeps its block's master and
        // moments; ZeRO-3 is ZeRO-2 of them). The frozen base is replicated, or under ZeRO-3 (planned
        // with --shard-weights) each rank keeps its block and the layers are gathered as they are used
        // (weights.h); shard_ is that block, and gives the loss's gather its rank and world.
        QT_CHECK(comm->world() == 1 || (zero_level == 3) == opt_.shard_weights, "GPU model: ",
                 flag(&LoraOptions::rank), "=", opt_.lora.rank, " at ZeRO-", zero_level, " but the model was planned ",
                 opt_.shard_weights ? "with " : "without ", flag(&ModelOptions::shard_weights), " (",
                 flag(RunFlag::ZeroLevel), "=3 and ", flag(&ModelOptions::shard_weights), " go together)");
        const ParamShard s = param_shard(layout_.total, comm->world(), comm->rank());
        QT_CHECK(!weights_->sharded() || (weights_->matrices_fp8_only() ? fp8_base_block(layout_, s.world, s.rank).count()
                                                                           : s.count()) > 0,
                 "GPU model: ", comm->world(), " ranks leave rank ", comm->rank(), " no part of this ", layout_.total,
                 "-element base to keep under ZeRO-3 (fewer ranks, or a larger model)");
        comm_ = comm;
        zero_level_ = zero_level;
        shard_ = s;
        if (weights_->sharded()) weights_->set_communicator(comm, s);
        // --train-also on the bf16 base's blocks: each rank writes its part of the trained tensors and
        // reads them whole from the owners (lora_adapters.h, set_base_block). Bound before the adapters'
        // communicator, whose upload writes the trained values into the base again (every rank: collective).
        if (weights_->flat_is_block())
            lora_->set_base_block({false, s.begin, s.end, [this](int64_t lo, int64_t hi, void* dst) {
                                       weights_->gather_range(lo, hi, dst, stream_);
                                   }});
        lora_->set_communicator(comm, zero_level);
        return;
    }
    QT_CHECK(comm->world() == 1 || (zero_level >= 2) == opt_.shard_gradients, "GPU model: ZeRO-", zero_level,
             " but the model was planned ", opt_.shard_gradients ? "with " : "without ",
             flag(&ModelOptions::shard_gradients), " (", flag(RunFlag::ZeroLevel), "=2 and ",
             flag(&ModelOptions::shard_gradients), " go together)");
    QT_CHECK(comm->world() == 1 || (zero_level == 3) == opt_.shard_weights, "GPU model: ZeRO-", zero_level,
             " but the model was planned ", opt_.shard_weights ? "with " : "without ",
             flag(&ModelOptions::shard_weights), " (", flag(RunFlag::ZeroLevel), "=3 and ",
             flag(&ModelOptions::shard_weights), " go together)");
    QT_CHECK(!opt_.offload_gradients || grads_->reduced_per_layer(),
             "GPU model: ", flag(&ModelOptions::offload_gradients),
             " with a communicator needs ZeRO-2's per-layer reductions");
    const ParamShard s = param_shard(layout_.total, comm->world(), comm->rank());
    QT_CHECK(s.count() > 0, "GPU model: ", comm->world(), " ranks leave rank ", comm->rank(),
             " no parameters of this ", layout_.total, "-element model (fewer ranks, or a larger model)");
    comm_ = comm;
    zero_level_ = zero_level;
    shard_ = s;
    grads_->set_communicator(comm, s, zero_level);
    if (weights_->sharded()) weights_->set_communicator(comm, s);
}

void CudaModel::reduce_gradients() {
    const int r = shard_.rank, K = cuda::norm_partials_count();
    // the gradient role's reduction for its ZeRO level: this rank's block, summed over the ranks
    const void* block = grads_->reduce_over_ranks();
    // the block's padding beyond the layout is zero, so summing all S elements adds nothing
    cuda::sum_squares_partials(buf_.norm_partials + r * K, block, opt_.param_grad_dtype, shard_.size, stream_);
    comm_->all_gather(buf_.norm_partials + r * K, buf_.norm_partials, K, DType::F32, stream_);
}

float CudaModel::global_loss() {
    if (!comm_) {
        float loss = 0;
        CUDA_CHECK(cudaMemcpyAsync(&loss, buf_.loss_acc, sizeof(float), cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaMemsetAsync(buf_.loss_acc, 0, sizeof(float), stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        return loss;
    }
    const int W = shard_.world, r = shard_.rank;
    CUDA_CHECK(cudaMemcpyAsync(buf_.rank_losses + r, buf_.loss_acc, sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    CUDA_CHECK(cudaMemsetAsync(buf_.loss_acc, 0, sizeof(float), stream_));
    comm_->all_gather(buf_.rank_losses + r, buf_.rank_losses, 1, DType::F32, stream_);
    std::vector<float> losses(W);
    CUDA_CHECK(cudaMemcpyAsync(losses.data(), buf_.rank_losses, W * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    double sum = 0.0;  // in rank order: every rank gets the same bits
    for (float x : losses) sum += x;
    return static_cast<float>(sum);
}

void CudaModel::gather_weights() {
    const DType A = opt_.model_dtype;
    char* w = static_cast<char*>(buf_.weights);
    auto t_ = timer_.scope("weight all-gather", stream_);
    comm_->all_gather(w + shard_.rank * shard_.size * dtype_size(A), w, static_cast<std::size_t>(shard_.size), A,
                      stream_);
}

// ---- block checkpoints: rank r of W writes block-r-of-W.safetensors (io/block_format.h) ----

// The array that holds the master of this rank's block: the block master itself, or (an fp32 model,
// or --master-dtype=bf16) the weights from the block's first element.
// (ZeRO-3: the weights are the block itself.)
static void master_source(const GpuBuffers& b, const ParamShard& s, bool block_master, bool weights_block,
                          DType model_dtype, const void*& base, DType& type, int64_t& off) {
    if (block_master) {
        base = b.master, type = DType::F32, off = 0;
    } else {
        base = b.weights, type = model_dtype, off = weights_block ? 0 : s.begin;
    }
}

void CudaModel::save_block_checkpoint(const std::string& dir) const {
    sync();
    SafeTensorsWriter w;
    const int64_t n = shard_.count();
    const void* mbase = nullptr;
    DType mtype = DType::F32;
    int64_t moff = 0;
    master_source(buf_, shard_, master_is_block(), weights_->sharded(), opt_.model_dtype, mbase, mtype, moff);
    struct Array {
        FlatArray array;
        const void* base;
        DType type;
        int64_t off;
        DType store;
    };
    const Array arrays[3] = {{FlatArray::Master, mbase, mtype, moff, opt_.master_dtype},
                             {FlatArray::ExpAvg, optimizer_->m(), opt_.opt_m_dtype, 0, opt_.opt_m_dtype},
                             {FlatArray::ExpAvgSq, optimizer_->v(), opt_.opt_v_dtype, 0, opt_.opt_v_dtype}};
    constexpr int64_t kPiece = kBlockPieceElements;  // one piece in host memory at a time
    for (const Array& a : arrays)
        for (int64_t p = 0; p * kPiece < n; ++p) {
            const int64_t len = std::min(kPiece, n - p * kPiece);
            w.add_f32_deferred(block_piece_name(flat_array_name(a.array), p), {len},
                               [this, a, p, len] { return fetch_values(a.base, a.type, a.off + p * kPiece, len); },
                               a.store);
        }
    BlockMeta meta;
    meta.rank = shard_.rank;
    meta.world = shard_.world;
    meta.begin = shard_.begin;
    meta.end = shard_.end;
    meta.total = layout_.total;
    meta.piece = kPiece;
    meta.zero_level = zero_level_;
    meta.layout = flat_layout_of(layout_).fingerprint();
    write_block_meta(w, meta);
    w.write((fs::path(dir) / block_file_name(shard_.rank, shard_.world)).string());
}

// Loads this rank's block [begin, end) from any checkpoint of this model (io/flat_state_reader.h):
// blocks of any world size or the named tensors of one GPU or the CPU model. It reads piece-sized
// chunks of the block, and the reader touches only the pieces of the checkpoint's blocks that overlap
// each chunk: at the world size that wrote the checkpoint, the chunks are this rank's own pieces, each
// read once (as before resharding existed); at another, the pieces of the one or two blocks that
// overlap this one (resharding on load, with no conversion step).
void CudaModel::load_block_checkpoint(const std::string& dir) {
    const FlatStateReader r(dir, flat_layout_of(layout_));
    const int64_t n = shard_.count();
    constexpr int64_t kChunk = kBlockPieceElements;
    std::vector<float> host;
    auto read = [&](FlatArray array, const std::function<void(int64_t, const float*, int64_t)>& store) {
        for (int64_t at = 0; at < n; at += kChunk) {
            const int64_t len = std::min(kChunk, n - at);
            host.resize(len);
            r.read(array, shard_.begin + at, shard_.begin + at + len, host.data());
            store(at, host.data(), len);
        }
    };
    const DType A = opt_.model_dtype;
    const std::size_t es = dtype_size(A);
    // the block's first weight (ZeRO-3: the block is all the weights there are)
    char* wblock = static_cast<char*>(buf_.weights) + (weights_->sharded() ? 0 : shard_.begin) * es;
    read(FlatArray::Master, [&](int64_t at, const float* v, int64_t len) {
        if (master_is_block()) {
            store_values(buf_.master + at, DType::F32, v, len);
            // the weights are the master rounded to nearest, as refresh_weights makes them
            cuda::convert_from_f32(wblock + at * es, A, buf_.master + at, len, stream_);
        } else {
            store_values(wblock + at * es, A, v, len);
        }
    });
    read(FlatArray::ExpAvg, [&](int64_t at, const float* v, int64_t len) {
        store_values(static_cast<char*>(optimizer_->m()) + at * dtype_size(opt_.opt_m_dtype), opt_.opt_m_dtype, v, len);
    });
    read(FlatArray::ExpAvgSq, [&](int64_t at, const float* v, int64_t len) {
        store_values(static_cast<char*>(optimizer_->v()) + at * dtype_size(opt_.opt_v_dtype), opt_.opt_v_dtype, v, len);
    });
    if (!weights_->sharded()) gather_weights();  // every rank's block (ZeRO-3: changed() sends the resident ones)
    grads_->clear();
    CUDA_CHECK(cudaMemsetAsync(buf_.loss_acc, 0, 4 * sizeof(float), stream_));
    weights_->changed();
    weights_->quantize();
    sync();
}

}  // namespace qtrain
