// The weights role (weights.h): where the layers' weights are, streaming them through two device
// slots, and their FP8 copies.
//
// Streaming (--shard-weights on one GPU): gather(l) copies a layer in on the copy stream — and
// quantises it there with --matmul-dtype=e4m3 — while the compute stream works on the neighbouring
// layer; get(l) waits for it, release(l) hands the slot back. Forward and backward visit layers in
// opposite orders, so the two layers at the turn (and at the start of the next micro-batch) are still
// in their slots.
//
// --persistent-quants (FP8 with FP8 gradients): the first time a layer arrives after an optimizer
// step it is copied in bf16 and quantised as above, and its row-major FP8 copy is then saved
// (buf_.quant_store: on the device, or pinned with --offload-quants) behind the slot's ready event.
// Every later pass of the step (the backward, the next micro-batches, eval) copies in the saved FP8
// bytes and only the small bf16 tensors (norm weights, q|k|v bias), and makes the transposed copy on
// the device: 1 byte per weight crosses PCIe instead of 2, and the codes are those of re-quantising.
//
// LoRA's FP8 base streamed (fp8_base_streamed): the load quantises each matrix once (in slot 0, then
// copied to the pinned host codes; under ZeRO-3 the part in the rank's block to its device block);
// gather(l) copies the layer's codes (one layer span of bytes) into its slot (ZeRO-3: from their
// owners), nothing is quantised or transposed as it arrives, and the backward transposes each
// matrix just in time from the slot as it does from the resident codes.
//
// Streaming does the same arithmetic in the same order as the flat buffers, so results are
// bit-identical to running without it.
//
// CUDA graphs (one GPU): the choices above (skip a layer still in its slot, quantise or copy the kept
// FP8 bytes) depend on the host-side state only (StreamState), so a pass captured from a state does
// the right copies whenever it is replayed from that state; the model keys its graphs by it. The
// events a capture waits on are recorded in it (begin_captured_pass), and replayed() records them
// again after each launch so that eager passes between replays order against the graph.
#include "model/cuda/weights.h"

#include <algorithm>
#include <utility>

#include "comm/communicator.h"
#include "core/error.h"
#include "cuda/check.h"
#include "cuda/fp8.h"
#include "cuda/kernels.h"
#include "cuda/pass_event.h"

namespace qtrain {

Weights::Weights(const GpuBuffers& b, const GpuParamLayout& layout, const ModelConfig& config,
                 const ModelOptions& o, cudaStream_t compute, OpTimer& timer)
    : buf_(b),
      layout_(layout),
      config_(config),
      type_(o.model_dtype),
      layers_(config.num_hidden_layers),
      timer_(timer),
      flat_(b.weights),
      amax_(b.weight_amax),
      fp8_(o.matmul_dtype == DType::E4M3),
      fp8_grads_(fp8_ && is_fp8(o.gradient_dtype)),
      fp8_head_(fp8_ && o.fp8_lm_head),
      streamed_(o.shard_weights),
      sharded_(weights_sharded_over_ranks(o)),
      fp8_gather_(fp8_weights_gathered(o)),
      fp8_only_(fp8_base_only(o)),
      jit_transpose_(fp8_transposes_just_in_time(o)),
      embed_on_host_(embedding_weights_on_host(config, o)),
      persist_quants_(streamed_quants_persist(o)),
      compute_(compute) {
    shard_ = param_shard(layout.total, 1, 0);
    quant_stored_.assign(persist_quants_ ? layers_ : 0, 0);
    if (!streamed_) return;
    copy_stream_ = cuda::Stream::non_blocking();
    for (int s = 0; s < 2; ++s) ready_[s] = cuda::Event::ordering(), free_[s] = cuda::Event::ordering();
    joined_ = cuda::Event::ordering();
}

Weights::~Weights() {
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
}

void Weights::sync() const {
    if (copy_stream_) CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
}

float* Weights::inv_scale(int l, Matrix m) const {
    return buf_.fp8_scales + 4 * fp8_slot(l, Fp8Slot::WeightInv, static_cast<int>(m));
}

void Weights::set_communicator(comm::Communicator* comm, const ParamShard& shard) {
    QT_CHECK(sharded_, "weights: internal error (a communicator for weights that are not sharded)");
    comm_ = comm;
    shard_ = shard;
    if (fp8_only_) code_block_ = fp8_base_block(layout_, shard.world, shard.rank);
}

// ---- where the weights come from ----

void Weights::fill_from_owners(int64_t lo, int64_t hi, void* dst, cudaStream_t stream) {
    fill_from_owners(lo, hi, dst, stream, flat_, type_);
}

void Weights::fill_from_owners(int64_t lo, int64_t hi, void* dst, cudaStream_t stream, const void* block, DType t) {
    fill_from_owners(lo, hi, dst, stream, block, t, shard_, 0);
}

void Weights::fill_from_owners(int64_t lo, int64_t hi, void* dst, cudaStream_t stream, const void* block, DType t,
                               const ParamShard& blocks, int64_t origin) {
    QT_CHECK(comm_, "weights: internal error (ZeRO-3 weights gathered before set_communicator)");
    const std::size_t es = dtype_size(t);
    for (int o = 0; o < blocks.world; ++o) {
        // rank o's block [origin + o * size, + size) of the flat space, cut to the range
        const int64_t ob = origin + static_cast<int64_t>(o) * blocks.size;
        const int64_t a = std::max(lo, ob), b = std::min(hi, ob + blocks.size);
        if (a >= b) continue;
        char* d = static_cast<char*>(dst) + (a - lo) * es;
        if (o == blocks.rank)  // the owner places its part, then sends it (broadcast is in place)
            CUDA_CHECK(cudaMemcpyAsync(d, static_cast<const char*>(block) + (a - ob) * es, (b - a) * es,
                                       cudaMemcpyDefault, stream));
        comm_->broadcast(d, static_cast<std::size_t>(b - a), t, o, stream);
    }
}

void Weights::fill_range(int64_t lo, int64_t hi, void* dst, cudaStream_t stream) {
    if (sharded_) return fill_from_owners(lo, hi, dst, stream);
    const std::size_t es = dtype_size(type_);
    CUDA_CHECK(cudaMemcpyAsync(dst, static_cast<const char*>(flat_) + lo * es, (hi - lo) * es, cudaMemcpyDefault,
                               stream));
}

void Weights::gather_range(int64_t lo, int64_t hi, void* dst, cudaStream_t stream) {
    QT_CHECK(lo >= 0 && lo <= hi && hi <= layout_.total, "weights: internal error (range ", lo, "..", hi, ")");
    if (lo < hi) fill_range(lo, hi, dst, stream);
}

// ---- where a parameter is ----

const void* Weights::at(int64_t off) const {
    const std::size_t es = dtype_size(type_);
    if (fp8_only_) return static_cast<const char*>(flat_) + layout_.compact_index(off) * es;  // (not a matrix)
    if (!streamed_) return static_cast<const char*>(flat_) + off * es;
    const int l = layout_.layer_of(off);
    if (l < 0) {
        if (embed_on_host_ && off < layout_.layer_begin(0))  // the lookup reads its rows over PCIe
            return static_cast<const char*>(flat_) + off * es;
        return static_cast<const char*>(buf_.resident_weights) + layout_.resident_index(off, !embed_on_host_) * es;
    }
    QT_CHECK(slot_layer_[l & 1] == l, "weight streaming: internal error (layer ", l, " is not in its slot)");
    const int64_t rel = off - layout_.layer_begin(l);
    QT_CHECK(slot_has_matrices_[l & 1] || !layout_.in_matrix(off),
             "weight streaming: internal error (bf16 matrix of layer ", l, " read with only its FP8 copy in the slot)");
    return static_cast<const char*>(buf_.weight_slots[l & 1]) + rel * es;
}

// The FP8 copy at flat offset off: in the flat copy, or in the slot of its (streamed) layer.
static const void* fp8_weight(const GpuParamLayout& layout, const int (&slot_layer)[2], bool streamed,
                              const void* flat, void* const (&slots)[2], int64_t off) {
    if (!streamed) return static_cast<const char*>(flat) + off;
    const int l = layout.layer_of(off);
    QT_CHECK(l >= 0 && slot_layer[l & 1] == l, "weight streaming: internal error (fp8 weights of layer ", l,
             " are not in their slot)");
    return static_cast<const char*>(slots[l & 1]) + (off - layout.layer_begin(l));
}

// LoRA's FP8 base without bf16 matrices (fp8_base_only): its copies span the layers only.
static const void* fp8_layer_weight(const GpuParamLayout& layout, const void* copies, int64_t off) {
    QT_CHECK(layout.layer_of(off) >= 0, "weights: internal error (the FP8 base has e4m3 copies of the layers only, "
             "not of element ", off, ")");
    return static_cast<const char*>(copies) + (off - layout.layer_begin(0));
}

const void* Weights::q(int64_t off) const {
    if (fp8_only_ && !streamed_) return fp8_layer_weight(layout_, buf_.wq, off);
    return fp8_weight(layout_, slot_layer_, streamed_, buf_.wq, buf_.quant_slots, off);
}

const void* Weights::qT(int64_t off) const {
    QT_CHECK(!jit_transpose_, "weights: internal error (no transposed copies are kept, just in time; transposed() "
             "makes one)");
    if (fp8_only_) return fp8_layer_weight(layout_, buf_.wTq, off);
    return fp8_weight(layout_, slot_layer_, streamed_, buf_.wTq, buf_.quantT_slots, off);
}

const void* Weights::transposed(int l, Matrix m) const {
    const MatrixShape g = layer_matrix(layout_, config_, l, m);
    if (!jit_transpose_) return qT(g.offset);
    auto t_ = timer_.scope(fp8_only_ ? "fp8 base transpose" : "fp8 weight transpose", compute_);
    cuda::transpose_fp8(buf_.wT_scratch, q(g.offset), g.rows, g.cols, compute_);
    return buf_.wT_scratch;
}

const void* Weights::lm_head_q() const {
    return buf_.lm_wq ? buf_.lm_wq : static_cast<const char*>(buf_.wq) + layout_.lm_head;
}

const void* Weights::lm_head_qT() const {
    QT_CHECK(fp8_head_ && fp8_grads_, "weights: internal error (the LM head's transposed FP8 copy without FP8 "
             "gradients)");
    return buf_.lm_wTq ? buf_.lm_wTq : static_cast<const char*>(buf_.wTq) + layout_.lm_head;
}

float* Weights::lm_head_inv_scale() const {
    return buf_.fp8_scales + 4 * fp8_head_slot(layers_, Fp8HeadSlot::WInv);
}

// ---- streaming ----

void Weights::gather(int l) {
    if (!streamed_ || l < 0 || l >= layers_) return;
    const int s = l & 1;
    if (slot_layer_[s] == l) return;
    const std::size_t es = dtype_size(type_);
    const int64_t begin = layout_.layer_begin(l), span = layout_.layer_span;
    if (fp8_only_) {  // the streamed FP8 base: the layer's codes as the load made them (its norms are resident)
        CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, free_[s], 0));
        auto t_ = timer_.scope(sharded_ ? "weight gather" : "weight stream", copy_stream_);  // (after the wait)
        // (ZeRO-3: the whole span from its owners, one or two broadcasts; the bytes at the norms' and
        // biases' places are never read)
        gather_codes(begin, begin + span, buf_.quant_slots[s], copy_stream_);
        CUDA_CHECK(cudaEventRecord(ready_[s], copy_stream_));
        slot_has_matrices_[s] = false;
        slot_layer_[s] = l;
        return;
    }
    char* slot = static_cast<char*>(buf_.weight_slots[s]);
    char* stored = persist_quants_ ? static_cast<char*>(buf_.quant_store) + l * span : nullptr;
    CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, free_[s], 0));
    auto t_ = timer_.scope(sharded_ ? "weight gather" : "weight stream", copy_stream_);  // (after the wait)
    if (fp8_gather_ && !(persist_quants_ && quant_stored_[l])) {
        // ZeRO-3 with FP8 weights: the bf16 norm weights and bias, then the matrices' FP8 codes from
        // their owners' quantised blocks (quantize_block), 1 byte per weight
        for (auto [from, to] : layout_.layer_runs(l, false))
            fill_from_owners(from, to, slot + (from - begin) * es, copy_stream_);
        char* q = static_cast<char*>(buf_.quant_slots[s]);
        for (auto [from, to] : layout_.layer_runs(l, true))
            fill_from_owners(from, to, q + (from - begin), copy_stream_, buf_.quant_block, DType::U8);
        if (fp8_grads_ && !jit_transpose_) transpose_layer_quants(l, q, buf_.quantT_slots[s], copy_stream_);
        CUDA_CHECK(cudaEventRecord(ready_[s], copy_stream_));
        if (persist_quants_) {
            CUDA_CHECK(cudaMemcpyAsync(stored, q, span, cudaMemcpyDefault, copy_stream_));
            quant_stored_[l] = 1;
        }
        slot_has_matrices_[s] = false;
    } else if (persist_quants_ && quant_stored_[l]) {
        // the bf16 norm weights and biases (e.g. [ln1, qkv_w), [qkv_b, o_w), [ln2, gate_up_w)), then the FP8 copy
        for (auto [from, to] : layout_.layer_runs(l, false))
            fill_range(from, to, slot + (from - begin) * es, copy_stream_);
        CUDA_CHECK(cudaMemcpyAsync(buf_.quant_slots[s], stored, span, cudaMemcpyDefault, copy_stream_));
        if (!jit_transpose_) transpose_layer_quants(l, buf_.quant_slots[s], buf_.quantT_slots[s], copy_stream_);
        CUDA_CHECK(cudaEventRecord(ready_[s], copy_stream_));
        slot_has_matrices_[s] = false;
    } else {
        fill_range(begin, begin + span, slot, copy_stream_);
        if (fp8_) quantize_layer(l, slot, buf_.quant_slots[s], buf_.quantT_slots[s], copy_stream_);
        CUDA_CHECK(cudaEventRecord(ready_[s], copy_stream_));
        // saved after the ready event (the compute stream need not wait for it); the next copy into
        // this slot is queued behind it on the same stream
        if (persist_quants_) {
            CUDA_CHECK(cudaMemcpyAsync(stored, buf_.quant_slots[s], span, cudaMemcpyDefault, copy_stream_));
            quant_stored_[l] = 1;
        }
        slot_has_matrices_[s] = true;
    }
    slot_layer_[s] = l;
}

void Weights::get(int l) {
    if (!streamed_) return;
    QT_CHECK(slot_layer_[l & 1] == l, "weight streaming: internal error (get of layer ", l, " before its gather)");
    // (timed: how long the compute stream waits for the layer, the copy or gather not hidden)
    auto t_ = timer_.scope(sharded_ ? "weight gather wait" : "weight stream wait", compute_);
    CUDA_CHECK(cudaStreamWaitEvent(compute_, ready_[l & 1], 0));
}

void Weights::release(int l) {
    if (!streamed_) return;
    CUDA_CHECK(cudaEventRecord(free_[l & 1], compute_));
}

void Weights::changed() { changed({{0, layout_.layer_begin(0)}, {layout_.layers_end(), layout_.total}}); }

void Weights::changed(const std::vector<std::pair<int64_t, int64_t>>& ranges) {
    if (!streamed_) return;
    const std::size_t es = dtype_size(type_);
    const int64_t head = layout_.layer_begin(0), end = layout_.layers_end();
    char* r = static_cast<char*>(buf_.resident_weights);
    const int64_t resident_head = embed_on_host_ ? 0 : head;  // the embedding stays on the host
    // (the streamed FP8 base's model-dtype tensors are resident: flat_ is on the device)
    if (!fp8_only_ && (!sharded_ || comm_)) {  // (ZeRO-3 before set_communicator: nothing to send yet)
        // the resident copy holds [0, head) (unless the embedding is read from the host) and then [end, total)
        for (const auto& [lo, hi] : ranges) {
            if (const int64_t b = std::min(hi, head); resident_head && lo < b) fill_range(lo, b, r + lo * es, compute_);
            if (const int64_t a = std::max(lo, end); a < hi)
                fill_range(a, hi, r + (resident_head + a - end) * es, compute_);
        }
        if (fp8_gather_) quantize_block();
    }
    // the next copies into the slots must wait for whatever just wrote the host weights
    slot_layer_[0] = slot_layer_[1] = -1;
    std::fill(quant_stored_.begin(), quant_stored_.end(), 0);  // quantised again on first use
    for (const cuda::Event& e : free_) CUDA_CHECK(cudaEventRecord(e, compute_));
}

// ---- CUDA graphs (weights.h: StreamState) ----

Weights::StreamState Weights::stream_state() const {
    return {{slot_layer_[0], slot_layer_[1]}, {slot_has_matrices_[0], slot_has_matrices_[1]}, quant_stored_};
}

void Weights::begin_captured_pass() {
    if (!streamed_) return;
    for (int s = 0; s < 2; ++s) {
        CUDA_CHECK(cudaEventRecord(free_[s], compute_));
        CUDA_CHECK(cudaEventRecord(ready_[s], compute_));
    }
    // the copy stream joins the capture here even in a pass that copies nothing (both layers of a
    // two-layer model still in their slots), so the end-of-pass join is a join inside the capture
    CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, free_[0], 0));
}

void Weights::join() {
    if (!streamed_) return;
    cuda::join_into(compute_, copy_stream_, joined_);
}

void Weights::replayed(const StreamState& end) {
    if (!streamed_) return;
    QT_CHECK(end.quant_stored.size() == quant_stored_.size(), "weight streaming: internal error (a captured pass's "
             "state has ", end.quant_stored.size(), " layers' FP8 flags, not ", quant_stored_.size(), ")");
    for (int s = 0; s < 2; ++s) {
        slot_layer_[s] = end.slot_layer[s];
        slot_has_matrices_[s] = end.slot_has_matrices[s];
        CUDA_CHECK(cudaEventRecord(free_[s], compute_));
        CUDA_CHECK(cudaEventRecord(ready_[s], compute_));
    }
    quant_stored_ = end.quant_stored;
}

// ---- FP8 copies ----

void Weights::quantize(bool amax_ready) {
    if (fp8_head_) quantize_lm_head();
    // streamed layers are quantised as they arrive (gather); the FP8 base's once by the load
    if (!fp8_ || streamed_ || fp8_only_) return;
    auto t_ = timer_.scope("fp8 quantize", compute_);
    for (int l = 0; l < layers_; ++l) {
        const int64_t b = layout_.layer_begin(l);
        quantize_layer(l, static_cast<const char*>(flat_) + b * dtype_size(type_), static_cast<char*>(buf_.wq) + b,
                       buf_.wTq ? static_cast<char*>(buf_.wTq) + b : nullptr, compute_, amax_ready);
    }
}

void Weights::quantize_lm_head() {
    auto t_ = timer_.scope("fp8 quantize", compute_);
    const int64_t V = config_.vocab_size, h = config_.hidden_size;
    const void* w = at(layout_.lm_head);  // resident in every mode (streamed: resident_weights)
    float* amax = buf_.fp8_scales + 4 * fp8_head_slot(layers_, Fp8HeadSlot::WAmax);
    void* q = const_cast<void*>(lm_head_q());
    cuda::abs_max(amax, type_, w, V * h, compute_);
    if (fp8_grads_)  // row-major copy (the logits GEMM) and transpose (the dx GEMM) in one pass
        cuda::quantize_fp8_transpose(const_cast<void*>(lm_head_qT()), DType::E4M3, w, type_, V, h, amax,
                                     lm_head_inv_scale(), compute_, q);
    else
        cuda::quantize_fp8(q, DType::E4M3, w, type_, V * h, amax, lm_head_inv_scale(), compute_);
}

void Weights::quantize_block() {
    auto t_ = timer_.scope("fp8 quantize", compute_);
    const std::size_t es = dtype_size(type_);
    const int K = 4 * layers_;
    float* mine = buf_.rank_amax + static_cast<int64_t>(shard_.rank) * K;
    const int64_t ob = static_cast<int64_t>(shard_.rank) * shard_.size, oe = ob + shard_.size;
    const char* w = static_cast<const char*>(flat_);
    // this rank's part [a, b) of matrix m of layer l (empty: a >= b)
    auto part = [&](int l, Matrix m) {
        const MatrixShape g = layer_matrix(layout_, config_, l, m);
        return std::pair{std::max(g.offset, ob), std::min(g.offset + g.rows * g.cols, oe)};
    };
    CUDA_CHECK(cudaMemsetAsync(mine, 0, K * sizeof(float), compute_));
    for (int l = 0; l < layers_; ++l)
        for (int mi = 0; mi < 4; ++mi)
            if (auto [a, b] = part(l, static_cast<Matrix>(mi)); a < b)
                cuda::abs_max(mine + 4 * l + mi, type_, w + (a - ob) * es, b - a, compute_, /*accumulate=*/true);
    comm_->all_gather(mine, buf_.rank_amax, static_cast<std::size_t>(K), DType::F32, compute_);
    // amax(l, m) is slot 4l + m of amax_; inv_scale(l, m) slot 16l + 4 + m of the scale slots
    cuda::max_over_ranks_fp8_scales(amax_, inv_scale(0, kQkv), buf_.rank_amax, K, shard_.world,
                                    {4, 4, kFp8SlotsPerLayer}, DType::E4M3, compute_);
    for (int l = 0; l < layers_; ++l)
        for (int mi = 0; mi < 4; ++mi)
            if (auto [a, b] = part(l, static_cast<Matrix>(mi)); a < b)
                cuda::quantize_fp8(static_cast<char*>(buf_.quant_block) + (a - ob), DType::E4M3, w + (a - ob) * es,
                                   type_, b - a, amax(l, static_cast<Matrix>(mi)), nullptr, compute_);
}

void Weights::quantize_layer(int l, const void* w_layer, void* q_layer, void* qT_layer, cudaStream_t stream,
                             bool amax_ready) {
    const std::size_t es = dtype_size(type_);
    const int64_t begin = layout_.layer_begin(l);
    for (int mi = 0; mi < 4; ++mi) {
        const Matrix m = static_cast<Matrix>(mi);
        const int64_t rel = layer_matrix(layout_, config_, l, m).offset - begin;
        quantize_one(l, m, static_cast<const char*>(w_layer) + rel * es, static_cast<char*>(q_layer) + rel,
                     qT_layer ? static_cast<char*>(qT_layer) + rel : nullptr, stream, amax_ready);
    }
}

void Weights::quantize_one(int l, Matrix m, const void* w, void* q, void* qT, cudaStream_t stream, bool amax_ready) {
    const MatrixShape g = layer_matrix(layout_, config_, l, m);
    if (!amax_ready) cuda::abs_max(amax(l, m), type_, w, g.rows * g.cols, stream);
    if (fp8_grads_ && qT)  // row-major copy and transpose in one pass
        cuda::quantize_fp8_transpose(qT, DType::E4M3, w, type_, g.rows, g.cols, amax(l, m), inv_scale(l, m), stream, q);
    else
        cuda::quantize_fp8(q, DType::E4M3, w, type_, g.rows * g.cols, amax(l, m), inv_scale(l, m), stream);
}

void Weights::quantize_matrix(int l, Matrix m, const void* w) {
    QT_CHECK(fp8_only_, "weights: internal error (quantize_matrix outside the FP8 base without bf16 matrices)");
    auto t_ = timer_.scope("fp8 quantize", compute_);
    const int64_t off = layer_matrix(layout_, config_, l, m).offset;
    // (without kept transposes the transposed codes go to the scratch and are dropped: the same kernel
    // as with them, so the row-major codes are the same bytes)
    void* qt = jit_transpose_ ? buf_.wT_scratch : const_cast<void*>(qT(off));
    if (!streamed_) return quantize_one(l, m, w, const_cast<void*>(q(off)), qt, compute_, false);
    // streamed: quantised on the device into slot 0 (at the matrix's place in a layer span; a copy in
    // flight there has finished first), then copied to the pinned host codes — under ZeRO-3 only the
    // part in this rank's block (every rank quantises the whole matrix, so every part has the whole
    // matrix's scale); slot 0 holds no layer after
    QT_CHECK(jit_transpose_, "weights: internal error (the streamed FP8 base keeps no transposed copies)");
    QT_CHECK(!sharded_ || comm_, "weights: internal error (the FP8 base loaded before set_communicator: which "
             "block to keep is not known yet)");
    const int64_t rel = off - layout_.layer_begin(l);
    char* slot = static_cast<char*>(buf_.quant_slots[0]) + rel;
    CUDA_CHECK(cudaStreamWaitEvent(compute_, ready_[0], 0));
    quantize_one(l, m, w, slot, qt, compute_, false);
    const MatrixShape g = layer_matrix(layout_, config_, l, m);
    int64_t a = off, b = off + g.rows * g.cols;  // the part this rank keeps (flat offsets)
    char* dst = static_cast<char*>(buf_.wq);
    if (sharded_) {
        const int64_t ob = layout_.layer_begin(0) + static_cast<int64_t>(code_block_.rank) * code_block_.size;
        a = std::max(a, ob), b = std::min(b, ob + code_block_.size);
        dst += a - ob;
    } else {
        dst += a - layout_.layer_begin(0);
    }
    if (a < b) CUDA_CHECK(cudaMemcpyAsync(dst, slot + (a - off), b - a, cudaMemcpyDefault, compute_));
    slot_layer_[0] = -1;
    CUDA_CHECK(cudaEventRecord(free_[0], compute_));  // (the next copy into slot 0 waits for this one)
}

const void* Weights::stored_q(int64_t off) const {
    QT_CHECK(fp8_only_ && !sharded_, "weights: internal error (stored FP8 codes outside the FP8 base, or of a rank's "
             "block: gather_codes)");
    return fp8_layer_weight(layout_, buf_.wq, off);
}

void Weights::gather_codes(int64_t lo, int64_t hi, void* dst, cudaStream_t stream) {
    QT_CHECK(fp8_only_ && lo >= layout_.layer_begin(0) && lo <= hi && hi <= layout_.layers_end(),
             "weights: internal error (FP8 base codes ", lo, "..", hi, ")");
    if (sharded_) return fill_from_owners(lo, hi, dst, stream, buf_.wq, DType::U8, code_block_, layout_.layer_begin(0));
    CUDA_CHECK(cudaMemcpyAsync(dst, fp8_layer_weight(layout_, buf_.wq, lo), hi - lo, cudaMemcpyDefault, stream));
}

void Weights::transpose_layer_quants(int l, const void* q_layer, void* qT_layer, cudaStream_t stream) {
    const int64_t begin = layout_.layer_begin(l);
    for (int mi = 0; mi < 4; ++mi) {
        const MatrixShape g = layer_matrix(layout_, config_, l, static_cast<Matrix>(mi));
        const int64_t rel = g.offset - begin;
        cuda::transpose_fp8(static_cast<char*>(qT_layer) + rel, static_cast<const char*>(q_layer) + rel, g.rows, g.cols,
                            stream);
    }
}

}  // namespace qtrain
