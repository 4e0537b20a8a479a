#include "model/cuda/gradients.h"

#include <algorithm>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/kernels.h"

namespace qtrain {

Gradients::Gradients(const GpuBuffers& b, const GpuParamLayout& layout, const ModelConfig& config,
                     const ModelOptions& o, uint32_t rounding_seed, cudaStream_t compute, OpTimer& timer)
    : layout_(layout),
      flat_(b.grads),
      resident_(b.resident_grads),
      slots_{b.grad_slots[0], b.grad_slots[1]},
      type_(o.param_grad_dtype),
      streamed_(gradients_staged(o)),
      embedding_on_host_(embedding_grad_on_host(config, o)),
      per_layer_(gradients_reduced_per_layer(o)),
      offloaded_(o.offload_gradients),
      timer_(timer),
      tmp_(b.grad_reduce_tmp),
      // (none for a frozen LoRA base, which has no gradient buffer)
      flat_elements_(!b.grads ? 0
                     : gradients_reduced_per_layer(o) ? param_shard(layout.total, o.gpus, 0).size
                                                      : layout.total),
      seed_(rounding_seed),
      compute_(compute) {
    if (!streamed_) return;
    zeroed_runs_ = layout.layer_non_matrix_elements();  // what no weight-gradient GEMM writes
    stream_ = cuda::Stream::non_blocking();
    for (int s = 0; s < 2; ++s) ready_[s] = cuda::PassEvent::ordering(), free_[s] = cuda::PassEvent::ordering();
    done_ = cuda::Event::ordering();
    joined_ = cuda::Event::ordering();
    // (ZeRO-2's per-layer reductions are not used under graphs: gradients_reduced_per_layer)
    if (o.use_cuda_graphs && !per_layer_) fresh_flag_ = reinterpret_cast<int32_t*>(b.step_scalars + 3);
}

Gradients::~Gradients() {
    if (stream_) cudaStreamSynchronize(stream_);
}

void Gradients::set_communicator(comm::Communicator* comm, const ParamShard& shard, int zero_level) {
    comm_ = comm;
    shard_ = shard;
    zero_level_ = zero_level;
}

void* Gradients::reduce_over_ranks() {
    QT_CHECK(comm_, "GPU model: internal error (gradients reduced over ranks without a communicator)");
    if (per_layer_) return flat_;  // ZeRO-2: the flushes summed the block already
    const int64_t S = shard_.size;
    const std::size_t es = dtype_size(type_);
    char* g = static_cast<char*>(flat_);
    char* block = g + shard_.rank * S * es;
    auto t_ = timer_.scope(zero_level_ == 1 ? "grad all-reduce" : "grad reduce-scatter", compute_);
    if (zero_level_ == 1) comm_->all_reduce(g, g, static_cast<std::size_t>(S) * shard_.world, type_, compute_);
    else comm_->reduce_scatter(g, block, static_cast<std::size_t>(S), type_, compute_);
    return block;
}

void Gradients::reduce_to_owners(const float* src, int64_t begin, int64_t n, cudaStream_t stream) {
    QT_CHECK(comm_, "GPU model: ZeRO-2 gradients need the communicator (set_communicator) before the backward");
    const int64_t S = shard_.size, end = begin + n;
    // every rank runs the same calls (they depend on the layout only); a part lies in one owner's
    // block, and no part is longer than the tmp buffer's layer span
    for (int64_t lo = begin; lo < end;) {
        const int q = static_cast<int>(lo / S);
        const int64_t hi = std::min({end, (q + 1) * S, lo + layout_.layer_span});
        comm_->reduce(src + (lo - begin), tmp_, static_cast<std::size_t>(hi - lo), DType::F32, q, stream);
        if (q != shard_.rank) {
            lo = hi;
            continue;
        }
        if (type_ == DType::BF16)  // --param-grad-dtype=bf16: rounded stochastically, keyed by the absolute element
            cuda::accumulate_bf16(static_cast<uint16_t*>(flat_) + (lo - q * S), tmp_, hi - lo, false,
                                  static_cast<uint64_t>(lo), seed_, stream);
        else
            cuda::add_f32(static_cast<float*>(flat_) + (lo - q * S), tmp_, hi - lo, stream);
        lo = hi;
    }
}

float* Gradients::at(int64_t off) const {
    if (!streamed_) return static_cast<float*>(flat_) + off;  // fp32 unless offloaded (check_options)
    const int l = layout_.layer_of(off);
    if (l < 0) return resident_ + layout_.resident_index(off, !embedding_on_host_);
    return slots_[l & 1] + (off - layout_.layer_begin(l));
}

bool Gradients::on_device_until_update(int64_t off) const {
    return streamed_ && layout_.layer_of(off) < 0 && !(embedding_on_host_ && off < layout_.layer_begin(0));
}

void Gradients::begin_layer(int l) {
    if (!streamed_) return;
    const int s = l & 1;
    free_[s].wait(compute_);
    // (the matrices' parts are written whole by their weight-gradient GEMMs: matrices_written_whole)
    for (GpuParamLayout::Range r : zeroed_runs_)
        CUDA_CHECK(cudaMemsetAsync(slots_[s] + r.begin, 0, (r.end - r.begin) * sizeof(float), compute_));
}

void Gradients::flush_layer(int l) {
    if (!streamed_) return;
    const int s = l & 1;
    ready_[s].record(compute_);
    ready_[s].wait(stream_);
    auto t_ = timer_.scope(per_layer_ ? "gradient reduce" : "gradient flush", stream_);  // (after the wait)
    const int64_t begin = layout_.layer_begin(l), n = layout_.layer_span;
    if (per_layer_) {
        reduce_to_owners(slots_[s], begin, n, stream_);
        free_[s].record(stream_);
        return;
    }
    if (type_ == DType::BF16) {
        if (fresh_flag_)  // (CUDA graphs: copy or add decided on the device)
            cuda::accumulate_bf16_or_overwrite(static_cast<uint16_t*>(flat_) + begin, slots_[s], n, fresh_flag_,
                                               static_cast<uint64_t>(begin), seed_, stream_);
        else
            cuda::accumulate_bf16(static_cast<uint16_t*>(flat_) + begin, slots_[s], n, host_fresh_,
                                  static_cast<uint64_t>(begin), seed_, stream_);
        free_[s].record(stream_);
        return;
    }
    float* dst = static_cast<float*>(flat_) + begin;
    if (fresh_flag_)
        cuda::add_f32_or_copy(dst, slots_[s], n, fresh_flag_, stream_);
    else if (host_fresh_)
        CUDA_CHECK(cudaMemcpyAsync(dst, slots_[s], n * sizeof(float), cudaMemcpyDefault, stream_));
    else
        cuda::add_f32(dst, slots_[s], n, stream_);
    free_[s].record(stream_);
}

void Gradients::end_backward() {
    host_fresh_ = false;  // this backward's layer flushes (all queued by now) wrote every layer element
    // (CUDA graphs: behind the flushes that read it, on their stream)
    if (fresh_flag_) CUDA_CHECK(cudaMemsetAsync(fresh_flag_, 0, sizeof(int32_t), stream_));
}

void Gradients::set_fresh_flag() {
    if (fresh_flag_) CUDA_CHECK(cudaMemsetAsync(fresh_flag_, 1, sizeof(int32_t), compute_));  // (nonzero)
}

void Gradients::join() {
    if (!streamed_) return;
    cuda::join_into(compute_, stream_, joined_);
    for (int s = 0; s < 2; ++s) ready_[s].settle(), free_[s].settle();
}

void Gradients::prepare_update() {
    if (!streamed_) return;
    CUDA_CHECK(cudaEventRecord(done_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    if (per_layer_) {  // the embedding (first) and the final norm and LM head, summed over the step
        const int64_t head = layout_.layer_begin(0), end = layout_.layers_end();
        reduce_to_owners(resident_, 0, head, compute_);
        reduce_to_owners(resident_ + head, end, layout_.total - end, compute_);
        return;
    }
    if (host_fresh_) zero_flat();  // no backward ran since the last update
    // head: the embedding's elements in resident (none when its backward writes the host copy)
    const int64_t head = embedding_on_host_ ? 0 : layout_.layer_begin(0), end = layout_.layers_end(),
                  tail = layout_.total - end;
    if (type_ == DType::BF16) {  // rounded once, from the fp32 sums of the whole step
        uint16_t* g = static_cast<uint16_t*>(flat_);
        cuda::accumulate_bf16(g, resident_, head, true, 0, seed_, compute_);
        cuda::accumulate_bf16(g + end, resident_ + head, tail, true, static_cast<uint64_t>(end), seed_, compute_);
        return;
    }
    float* g = static_cast<float*>(flat_);
    if (head) CUDA_CHECK(cudaMemcpyAsync(g, resident_, head * sizeof(float), cudaMemcpyDefault, compute_));
    CUDA_CHECK(cudaMemcpyAsync(g + end, resident_ + head, tail * sizeof(float), cudaMemcpyDefault, compute_));
}

void Gradients::finish_update() {
    if (!streamed_ || per_layer_) zero_flat();  // (ZeRO-2: every flush adds into the block)
    if (!streamed_) return;
    host_fresh_ = true;  // the next backward copies instead of adding
    set_fresh_flag();
    zero_resident();
}

void Gradients::clear() {
    zero_flat();
    host_fresh_ = true;
    set_fresh_flag();
    zero_resident();
}

void Gradients::sync() const {
    if (stream_) CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void Gradients::zero_flat() {
    const std::size_t bytes = flat_elements_ * dtype_size(type_);
    if (bytes == 0) return;  // (a frozen LoRA base)
    if (offloaded_) cuda::fill_zero(flat_, bytes, compute_);  // pinned host memory, stream-ordered
    else CUDA_CHECK(cudaMemsetAsync(flat_, 0, bytes, compute_));
}

void Gradients::zero_resident() {
    if (!streamed_) return;
    const int64_t head = layout_.layer_begin(0), tail = layout_.total - layout_.layers_end();
    if (embedding_on_host_) {
        // the embedding backward adds into the host copy, which must start the step at zero (the
        // optimizer reads every row, touched or not): cleared over PCIe, ~0.1 s for 7B's 2.2 GB
        cuda::fill_zero(flat_, head * dtype_size(type_), compute_);
        CUDA_CHECK(cudaMemsetAsync(resident_, 0, tail * sizeof(float), compute_));
        return;
    }
    CUDA_CHECK(cudaMemsetAsync(resident_, 0, (head + tail) * sizeof(float), compute_));
}

}  // namespace qtrain
