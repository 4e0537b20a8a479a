// The weights role of the GPU model (docs/design.md, "GPU model roles"): the model-dtype weights the
// layers read, their FP8 copies, and where both are. Resident: one flat buffer on the device (and,
// with --matmul-dtype=e4m3, flat FP8 copies quantised once per optimizer step). Streamed
// (--shard-weights on one GPU): the flat copy is in pinned host memory; the embedding, final norm and
// LM head stay resident, and the layers pass through two device slots (layer l in slot l % 2) on the
// role's own copy stream, quantised there as they arrive; with --persistent-quants each layer's FP8
// copy is kept after its first pass of a step and copied in instead of the bf16 matrices.
//
// Sharded over data-parallel ranks (ZeRO-3, --shard-weights with --gpus > 1): the flat copy is the
// rank's block of the weights only (param_shard.h; on the device, or pinned with --offload-master).
// The layers pass through the same two slots, but gather(l) fills a slot from the ranks that own
// the layer's elements — each owner places its part and broadcasts it, on the copy stream — so the
// layer is assembled one layer ahead while the compute stream works, forward and backward alike;
// the non-layer weights are resident on every rank, broadcast from their owners by changed(). Every
// rank makes the same gather/changed calls in the same order (the step's schedule is the same on
// every rank), which is what makes them valid collectives. The slot bytes are the unsharded
// weights' bytes, so results equal ZeRO-1/2's bit for bit. With FP8 weights and FP8 gradients
// (fp8_weights_gathered) the matrices travel as FP8 codes instead: after each update every rank
// takes the abs-max of its part of each matrix, the parts' maxima are all-gathered and combined into
// the whole matrix's scale, each rank quantises its part with it, and gather(l) moves those bytes
// (half of bf16's) with the small bf16 tensors; quantising is elementwise with one scale per
// matrix, so the codes are those of quantising the gathered layer, bit for bit.
//
// LoRA's FP8 base streamed (--shard-weights under LoRA, fp8_base_streamed in gpu_buffers.h) uses the
// same slots, events and copy stream for its layers' e4m3 codes (kept in pinned host memory); its
// model-dtype tensors (norms, biases, embedding, head) stay resident. Under ZeRO-3 the rank keeps only
// its block of the codes on the device (fp8_base_block) and gather(l) fills the slot from the owners,
// as above but one byte per element; the load quantised every whole matrix on every rank, so the
// scales are the whole matrices' and the gathered codes the unsharded ones. LoRA's bf16 base under
// ZeRO-3 is the full model's case (the model-dtype block, gathered), without updates: nothing is
// reduced or re-quantised after a step.
//
// --fp8-weight-transposes=jit (fp8_transposes_just_in_time) drops the transposed copies of the full
// model's layer matrices (wTq, or quantT_slots when streamed / ZeRO-3): quantize() and the slots write
// the row-major codes only, and transposed(l, m) makes each Wᵀ as the backward asks for it.
//
// Layer code reads parameters through at / q (flat offsets) and transposed (layer, matrix) after
// get(l) of the layer. Its memory is bound by bind_gpu_buffers (so the plan counts it); its stream,
// events and slot state are its own.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/op_timer.h"
#include "cuda/stream.h"
#include "model/cuda/gpu_buffers.h"
#include "model/cuda/gpu_layout.h"
#include "model/cuda/layer_matrices.h"
#include "model/cuda/param_shard.h"
#include "model/model_config.h"
#include "model/model_options.h"

namespace qtrain {

namespace comm {
class Communicator;
}

class Weights {
public:
    // `compute`: the model's compute stream, which every call orders against; `timer`: the model's
    // per-op timer (the quantisation is one of its scopes).
    Weights(const GpuBuffers& buffers, const GpuParamLayout& layout, const ModelConfig& config,
            const ModelOptions& options, cudaStream_t compute, OpTimer& timer);
    ~Weights();
    Weights(const Weights&) = delete;
    Weights& operator=(const Weights&) = delete;

    bool streamed() const { return streamed_; }
    // ZeRO-3: `comm` is the data-parallel world and `shard` this rank's block, which the flat copy
    // holds. Before it is set (the model's construction) changed() leaves the resident copies alone.
    void set_communicator(comm::Communicator* comm, const ParamShard& shard);
    // Whether the layers are gathered over the ranks (ZeRO-3: collective), and whether `flat` is the
    // rank's block of the model-dtype weights (ZeRO-3 but for LoRA's FP8 base, whose `flat` holds its
    // non-matrix tensors whole on every rank and whose block is of its codes).
    bool sharded() const { return sharded_; }
    bool flat_is_block() const { return sharded_ && !fp8_only_; }
    // The whole flat model-dtype copy (pinned host memory when streamed; the master itself in fp32;
    // under ZeRO-3 the rank's block, element 0 = the block's first).
    void* flat() const { return flat_; }
    // The model-dtype weights [lo, hi) of the flat space into dst (device memory), on `stream`.
    // Collective under ZeRO-3 (every rank calls it with the same range: what the export and the
    // tests read); elsewhere a copy from the flat buffer.
    void gather_range(int64_t lo, int64_t hi, void* dst, cudaStream_t stream);

    // The model-dtype weight at flat offset off, and its FP8 copies (row-major; transposed, only with
    // FP8 gradients): in the flat buffers, or in the slot of its streamed layer.
    const void* at(int64_t off) const;
    const void* q(int64_t off) const;
    const void* qT(int64_t off) const;
    // The transposed FP8 copy ([in, out]) of layer l's matrix m, which the input-gradient GEMM reads:
    // qT of the matrix, or, without kept transposes (fp8_transposes_just_in_time: LoRA's FP8 base, or
    // --fp8-weight-transposes=jit), its row-major copy (resident, or in the layer's streamed slot)
    // transposed now into the one scratch buffer (buf_.wT_scratch) on the compute stream, valid until
    // the next call. The bytes are the kept copy's either way (quantising is per tensor, transposing
    // moves bytes as they are). A kernel on the compute stream: CUDA graphs capture it.
    const void* transposed(int l, Matrix m) const;
    // --lm-head-dtype=e4m3: the LM head's FP8 copies (row-major [V, h]; transposed [h, V], only with
    // FP8 gradients) and its inverse scale, made by quantize() from the head (the embedding when
    // tied): in wq / wTq at its flat offset, or (streamed: the head is resident; LoRA's FP8 base
    // without bf16 matrices, whose wq / wTq span the layers only) in their own buffers.
    const void* lm_head_q() const;
    const void* lm_head_qT() const;
    float* lm_head_inv_scale() const;
    // FP8 per-tensor abs-max and inverse scale of layer l's matrix m (16-byte slots).
    float* amax(int l, Matrix m) const { return amax_ + 4 * (4 * l + static_cast<int>(m)); }
    float* inv_scale(int l, Matrix m) const;
    // The contiguous abs-max slots of every layer (AdamW folds the new weights' abs-max into them),
    // and their size in bytes.
    float* amax_slots() const { return amax_; }
    std::size_t amax_bytes() const { return 16 * 4 * static_cast<std::size_t>(layers_); }
    // Whether AdamW can compute the abs-max as it writes the weights (FP8 with resident weights;
    // streamed layers are quantised as they arrive instead).
    bool amax_from_update() const { return fp8_ && !streamed_; }

    // Streaming: gather(l) starts copying layer l into its slot (and quantising it) on the copy
    // stream unless the slot already holds it; get(l) makes the compute stream wait for it;
    // release(l) marks the slot reusable once the compute work queued so far is done. No-ops when
    // resident (and for layers outside [0, layers)).
    void gather(int l);
    void get(int l);
    void release(int l);
    // The flat weights changed (an update, a load): refresh the resident copies and empty the slots.
    void changed();
    // The same after a write of only the flat ranges [lo, hi) (LoRA's --train-also tensors): the resident
    // copies of those ranges are refreshed (collective under ZeRO-3: every rank passes the same ranges),
    // the slots emptied (a layer range's new values are read by the next copy or gather into a slot).
    void changed(const std::vector<std::pair<int64_t, int64_t>>& ranges);
    // Resident FP8: quantise every layer again (streamed layers are quantised as they arrive);
    // amax_ready: AdamW has just written the abs-max slots. With an FP8 LM head, the head is quantised
    // here in every mode (it is resident when streamed; under ZeRO-3 every rank quantises it after
    // changed() has broadcast it), its abs-max taken here.
    void quantize(bool amax_ready = false);
    // The LM head's FP8 copies (--lm-head-dtype=e4m3) from its resident model-dtype weights, on the compute
    // stream: quantize() does it; LoRA's --train-also=embeddings after each write of the trained head.
    void quantize_lm_head();
    // The FP8 base without bf16 matrices (fp8_base_only): `flat` holds no layer matrix (at() of one
    // throws), quantize() leaves the layers alone, and the load quantises each matrix m of layer l
    // once from its model-dtype values w ([rows, cols] on the device, e.g. a staging buffer) with
    // quantize_matrix, on the compute stream: the kernels and scales quantize() would use.
    bool matrices_fp8_only() const { return fp8_only_; }
    // Streamed (fp8_base_streamed): quantised into slot 0 and copied to the pinned host codes.
    void quantize_matrix(int l, Matrix m, const void* w);
    // The FP8 base's row-major codes at flat offset off where they are kept: on the device, or in
    // pinned host memory when streamed (what the load wrote; the tests read it).
    const void* stored_q(int64_t off) const;
    // The FP8 base's row-major codes of the flat range [lo, hi) (within the layers) into dst (device
    // memory), on `stream`: from the owners' blocks under ZeRO-3 (collective: every rank calls it with
    // the same range), else copied from where they are kept. What the tests compare with the unsharded.
    void gather_codes(int64_t lo, int64_t hi, void* dst, cudaStream_t stream);
    void sync() const;  // waits for the copy stream

    // CUDA graphs with streaming (one GPU). Which layers a pass copies in is decided on the host from
    // this state (what each slot holds; with --persistent-quants, which layers' FP8 copies are kept),
    // so a captured pass is valid exactly when it starts from the state its capture started from,
    // and it leaves the state its capture left. The model keeps one graph per starting state (a
    // handful: empty slots after an update, layers 0 and 1 after a backward, the last two after a
    // forward alone). Default when not streamed: one state, one graph.
    struct StreamState {
        std::array<int, 2> slot_layer{-1, -1};
        std::array<bool, 2> slot_has_matrices{true, true};
        std::vector<char> quant_stored;
        bool operator==(const StreamState&) const = default;
    };
    StreamState stream_state() const;
    // First thing inside a capture: forks the copy stream into it, and records the slots' events
    // there (a capture may wait only on events it recorded): a layer already in its slot is ready as
    // of the pass's start, because join() ordered its copy before the pass.
    void begin_captured_pass();
    // The compute stream waits for everything queued on the copy stream (before each captured pass
    // or replay, eagerly; at the end of each pass, inside the capture, which must end joined).
    void join();
    // After a launch of the graph captured from some state (eager): the slots are as that capture
    // left them (`end`), and the events are recorded again after the graph, so later eager copies
    // into a slot wait for the graph's reads and later gets find them ready.
    void replayed(const StreamState& end);

private:
    // The FP8 copies of layer l's four matrices from its weights at w (q, qT: the layer's quantised
    // copies, laid out like the weights, one byte per element), on `stream`.
    void quantize_layer(int l, const void* w, void* q, void* qT, cudaStream_t stream, bool amax_ready = false);
    // Its one matrix m from w (that matrix's first weight) into q / qT (that matrix's first byte).
    void quantize_one(int l, Matrix m, const void* w, void* q, void* qT, cudaStream_t stream, bool amax_ready);
    // qT = the transposes of the four matrices already quantised in q: what quantize_layer writes to
    // qT, bit for bit.
    void transpose_layer_quants(int l, const void* q, void* qT, cudaStream_t stream);
    // ZeRO-3: dst (element lo) = the flat weights [lo, hi), from the rank(s) whose blocks hold them.
    void fill_from_owners(int64_t lo, int64_t hi, void* dst, cudaStream_t stream);
    // The same from each owner's `block` of elements of type t (the weights, or their FP8 codes); rank
    // o's block holds [origin + o * blocks.size, + blocks.size) of the flat space (the weights' blocks:
    // shard_ from 0; LoRA's FP8 base: code_block_ from the first layer).
    void fill_from_owners(int64_t lo, int64_t hi, void* dst, cudaStream_t stream, const void* block, DType t);
    void fill_from_owners(int64_t lo, int64_t hi, void* dst, cudaStream_t stream, const void* block, DType t,
                          const ParamShard& blocks, int64_t origin);
    // ZeRO-3 with FP8 weights (fp8_weights_gathered): every matrix's abs-max over the ranks' parts
    // and its scales, then this rank's part quantised into buf_.quant_block, on the compute stream.
    void quantize_block();
    // Where a layer's weights come from: the flat copy (streaming) or the owners (ZeRO-3).
    void fill_range(int64_t lo, int64_t hi, void* dst, cudaStream_t stream);

    const GpuBuffers& buf_;
    const GpuParamLayout& layout_;
    const ModelConfig& config_;
    const DType type_;
    const int layers_;
    OpTimer& timer_;
    void* flat_ = nullptr;
    float* amax_ = nullptr;
    bool fp8_ = false, fp8_grads_ = false;
    bool fp8_head_ = false;            // --lm-head-dtype=e4m3
    bool streamed_ = false;            // --shard-weights (one GPU: from host memory; ZeRO-3: from the owners)
    bool sharded_ = false;             // ZeRO-3 (weights_sharded_over_ranks)
    bool fp8_gather_ = false;          // the layers' matrices gathered as FP8 codes (fp8_weights_gathered)
    bool fp8_only_ = false;            // LoRA's FP8 base keeps no bf16 matrices (fp8_base_only)
    bool jit_transpose_ = false;       // no transposed e4m3 copies kept (fp8_transposes_just_in_time)
    comm::Communicator* comm_ = nullptr;
    ParamShard shard_;
    ParamShard code_block_;  // LoRA's FP8 base under ZeRO-3: the rank's block of the layers' codes (buf_.wq)
    bool embed_on_host_ = false;       // embedding_weights_on_host (gpu_buffers.h)
    bool persist_quants_ = false;      // streamed_quants_persist (gpu_buffers.h)
    cudaStream_t compute_ = nullptr;
    cuda::Stream copy_stream_;
    cuda::Event ready_[2], free_[2];
    cuda::Event joined_;  // join(): the copy stream's work so far
    int slot_layer_[2] = {-1, -1};  // the layer each slot holds (-1: none)
    // --persistent-quants: whether layer l's FP8 copy is in buf_.quant_store for the current weights,
    // and whether each slot holds its layer's bf16 matrices (a layer filled from the store gets only
    // its norms and biases in bf16; its matrices are FP8 only).
    std::vector<char> quant_stored_;
    bool slot_has_matrices_[2] = {true, true};
};

}  // namespace qtrain
