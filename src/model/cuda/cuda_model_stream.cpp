// The weight access protocol (docs/design.md, "Memory") of the GPU model: weight streaming.
//
// --shard-weights on one GPU: the model-dtype weights live in pinned host memory; the embedding,
// final norm and LM head stay resident on the device, and the layers pass through two device slots
// (layer l in slot l % 2). gather(l) copies a layer in on the copy stream — and quantises it there
// with --matmul-dtype=e4m3 — while the compute stream works on the neighbouring layer; get(l) waits
// for it, release(l) hands the slot back. Forward and backward visit layers in opposite orders, so
// the two layers at the turn (and at the start of the next micro-batch) are still in their slots.
//
// --persistent-quants (FP8 with FP8 gradients): the first time a layer arrives after an optimizer
// step it is copied in bf16 and quantised as above, and its row-major FP8 copy is then saved
// (buf_.quant_store: on the device, or pinned with --offload-quants) behind the slot's ready event.
// Every later pass of the step (the backward, the next micro-batches, eval) copies in the saved FP8
// bytes and only the small bf16 tensors (norm weights, q|k|v bias), and makes the transposed copy on
// the device: 1 byte per weight crosses PCIe instead of 2, and the codes are those of re-quantising.
//
// (--offload-gradients and --offload-residual are roles of their own: gradients.h and
// residual_offload.h.)
//
// Streaming does the same arithmetic in the same order as the flat buffers, so results are
// bit-identical to running without it.
#include "model/cuda/cuda_model.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/kernels.h"

namespace qtrain {

// --param-grad-dtype=bf16 rounds the host gradients with random bits independent of the optimizer's
// (same seed, salted)
constexpr uint64_t kGradRoundingSalt = 0x5bd1e995u;


void CudaModel::create_streams() {
    stream_weights_ = opt_.shard_weights;
    persist_quants_ = streamed_quants_persist(opt_);
    quant_stored_.assign(persist_quants_ ? config_.num_hidden_layers : 0, 0);
    embed_weights_host_ = embedding_weights_on_host(config_, opt_);
    auto event = [](cudaEvent_t& e) { CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); };
    if (stream_weights_) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
        for (int s = 0; s < 2; ++s) event(w_ready_[s]), event(w_free_[s]);
    }
    grads_ = std::make_unique<Gradients>(buf_, layout_, config_, opt_, static_cast<uint32_t>(sr_seed_ ^ kGradRoundingSalt),
                                         stream_);
    residuals_ = std::make_unique<ResidualOffload>(
        opt_.offload_residual ? buf_.res_host : nullptr, buf_.res_slots,
        static_cast<std::size_t>(opt_.batch_size) * opt_.seq_len * config_.hidden_size * dtype_size(opt_.model_dtype),
        stream_);
    optimizer_ = std::make_unique<OptimizerState>(buf_.opt, opt_, layout_.total);
}

void CudaModel::destroy_streams() {
    optimizer_.reset();  // each role waits for its own streams
    residuals_.reset();
    grads_.reset();
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
    for (int s = 0; s < 2; ++s)
        for (cudaEvent_t e : {w_ready_[s], w_free_[s]})
            if (e) cudaEventDestroy(e);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
}

// ---- where a parameter is ----

// Whether flat offset off, inside the span of the layer with offsets o, belongs to one of its four
// matrices rather than a norm weight or the q|k|v bias.
static bool in_weight_matrix(const GpuLayerOffsets& o, int64_t off) {
    return (off >= o.qkv_w && off < o.qkv_b) || (off >= o.o_w && off < o.ln2) || off >= o.gate_up_w;
}

const void* CudaModel::weight(int64_t off) const {
    const std::size_t es = dtype_size(opt_.model_dtype);
    if (!stream_weights_) return static_cast<const char*>(buf_.weights) + off * es;
    const int l = layout_.layer_of(off);
    if (l < 0) {
        if (embed_weights_host_ && off < layout_.layer_begin(0))  // the lookup reads its rows over PCIe
            return static_cast<const char*>(buf_.weights) + off * es;
        return static_cast<const char*>(buf_.resident_weights) + layout_.resident_index(off, !embed_weights_host_) * es;
    }
    QT_CHECK(slot_layer_[l & 1] == l, "weight streaming: internal error (layer ", l, " is not in its slot)");
    const int64_t rel = off - layout_.layer_begin(l);
    QT_CHECK(slot_has_matrices_[l & 1] || !in_weight_matrix(layout_.layers[l], off),
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

const void* CudaModel::weight_q(int64_t off) const {
    return fp8_weight(layout_, slot_layer_, stream_weights_, buf_.wq, buf_.quant_slots, off);
}

const void* CudaModel::weight_qT(int64_t off) const {
    return fp8_weight(layout_, slot_layer_, stream_weights_, buf_.wTq, buf_.quantT_slots, off);
}

// ---- weights ----

void CudaModel::gather(int l) {
    if (!stream_weights_ || l < 0 || l >= config_.num_hidden_layers) return;
    const int s = l & 1;
    if (slot_layer_[s] == l) return;
    const std::size_t es = dtype_size(opt_.model_dtype);
    const int64_t begin = layout_.layer_begin(l), span = layout_.layer_span;
    const char* host = static_cast<const char*>(buf_.weights) + begin * es;
    char* slot = static_cast<char*>(buf_.weight_slots[s]);
    char* stored = persist_quants_ ? static_cast<char*>(buf_.quant_store) + l * span : nullptr;
    CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, w_free_[s], 0));
    if (persist_quants_ && quant_stored_[l]) {
        // the bf16 norm weights and bias, [ln1, qkv_w), [qkv_b, o_w) and [ln2, gate_up_w), then the FP8 copy
        const GpuLayerOffsets& o = layout_.layers[l];
        for (auto [from, to] : {std::pair{o.ln1, o.qkv_w}, {o.qkv_b, o.o_w}, {o.ln2, o.gate_up_w}})
            CUDA_CHECK(cudaMemcpyAsync(slot + (from - begin) * es, host + (from - begin) * es, (to - from) * es,
                                       cudaMemcpyDefault, copy_stream_));
        CUDA_CHECK(cudaMemcpyAsync(buf_.quant_slots[s], stored, span, cudaMemcpyDefault, copy_stream_));
        transpose_layer_quants(l, buf_.quant_slots[s], buf_.quantT_slots[s], copy_stream_);
        CUDA_CHECK(cudaEventRecord(w_ready_[s], copy_stream_));
        slot_has_matrices_[s] = false;
    } else {
        CUDA_CHECK(cudaMemcpyAsync(slot, host, span * es, cudaMemcpyDefault, copy_stream_));
        if (fp8_) quantize_layer(l, slot, buf_.quant_slots[s], buf_.quantT_slots[s], copy_stream_);
        CUDA_CHECK(cudaEventRecord(w_ready_[s], copy_stream_));
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

void CudaModel::get(int l) {
    if (!stream_weights_) return;
    QT_CHECK(slot_layer_[l & 1] == l, "weight streaming: internal error (get of layer ", l, " before its gather)");
    CUDA_CHECK(cudaStreamWaitEvent(stream_, w_ready_[l & 1], 0));
}

void CudaModel::release(int l) {
    if (!stream_weights_) return;
    CUDA_CHECK(cudaEventRecord(w_free_[l & 1], stream_));
}

void CudaModel::weights_changed() {
    if (!stream_weights_) return;
    const std::size_t es = dtype_size(opt_.model_dtype);
    const int64_t head = layout_.layer_begin(0), tail = layout_.total - layout_.layers_end();
    const char* w = static_cast<const char*>(buf_.weights);
    char* r = static_cast<char*>(buf_.resident_weights);
    const int64_t resident_head = embed_weights_host_ ? 0 : head;  // the embedding stays on the host
    if (resident_head) CUDA_CHECK(cudaMemcpyAsync(r, w, head * es, cudaMemcpyDefault, stream_));
    CUDA_CHECK(cudaMemcpyAsync(r + resident_head * es, w + layout_.layers_end() * es, tail * es, cudaMemcpyDefault,
                               stream_));
    // the next copies into the slots must wait for whatever just wrote the host weights
    slot_layer_[0] = slot_layer_[1] = -1;
    std::fill(quant_stored_.begin(), quant_stored_.end(), 0);  // quantised again on first use
    for (cudaEvent_t e : w_free_) CUDA_CHECK(cudaEventRecord(e, stream_));
}

}  // namespace qtrain
