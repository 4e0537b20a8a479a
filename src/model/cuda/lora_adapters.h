// The LoRA adapters of the GPU model (issue 33, model/lora.h; docs/design.md, "LoRA adapters"): a role
// like the weights and gradients ones. The layer program's linear steps call forward() after a
// target's base GEMM and backward() after its input-gradient GEMM (cuda_model_linear.cpp), so the
// forward, the recompute and the backward share them. Per adapter of input x [N, in], A [r, in],
// B [out, r], s = alpha / r:
//   forward   u = drop(x) A^T (kept for the backward),  y += s u B^T
//   backward  g = s dy B,  dB += s dy^T u,  dA += g^T drop(x),  dx += drop'(g A)
// with every GEMM through cuBLASLt in the model dtype and the adapter gradients accumulated in fp32.
// q, k and v (and gate, up) are column slices of one fused GEMM's output: y, dy are views with the
// fused matrix's row stride; the layer program calls forward_matrix / backward_matrix for all of a
// fused matrix's targets, which read x once where the layout stacks their A's (lora_layout.h). Dropout's mask is the CPU model's (core/lora_dropout.h), drawn from the
// device's pass count so a CUDA graph replays each pass's masks. The state (fp32 master, gradient,
// AdamW moments) lives in the buffers bind_gpu_buffers carved (GpuBuffers::lora); the host mirror
// (CpuLora) gives the initialisation, the PEFT adapter files and the checkpoint files, so a GPU
// checkpoint or adapter is the CPU model's.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/kernels.h"
#include "cuda/op_timer.h"
#include "model/cpu/cpu_lora.h"
#include "model/cuda/gpu_buffers.h"
#include "model/cuda/lora_layout.h"
#include "model/cuda/optimizer_state.h"
#include "model/cuda/param_shard.h"
#include "model/model_options.h"

namespace qtrain {

namespace comm {
class Communicator;
}
class GemmRunner;

class LoraAdapters {
public:
    LoraAdapters(const LoraBuffers& buffers, const ModelConfig& config, const ModelOptions& options,
                 GemmRunner& gemm, cudaStream_t stream, OpTimer& timer);
    ~LoraAdapters();
    LoraAdapters(const LoraAdapters&) = delete;
    LoraAdapters& operator=(const LoraAdapters&) = delete;

    const LoraLayout& layout() const { return layout_; }
    bool has(int l, LoraTarget t) const { return layout_.has(l, t); }

    // y[N, out] (row stride ldy) += s drop(x) A^T B^T for layer l's target t (nothing without an adapter);
    // x [N, in] contiguous. training: dropout acts (a training forward or its recompute). `write`: y =
    // instead of += (the base GEMM then accumulates onto it: writes_whole).
    void forward(int l, LoraTarget t, void* y, int64_t ldy, const void* x, int N, bool training, bool write = false);
    // The adapter's gradients (fp32, accumulated) and dx[N, in] += its input gradient; dy [N, out]
    // with row stride ldy; x as in the forward. `write`: dx = (no dropout only).
    void backward(int l, LoraTarget t, void* dx, const void* dy, int64_t ldy, const void* x, int N,
                  bool write = false);
    // The same for every adapter of one fused matrix: targets[j] writes (reads) the columns from cols[j]
    // of y (dy), row stride ldy, all reading the one input x. Where the layout stacks them
    // (LoraLayout::stacked: q|k|v, gate|up, no dropout) x is read once: u = x [A_1; ..; A_G]^T is one
    // GEMM ([N, G r], the G saved slots), and so are dA += g^T x and dx += g [A_1; ..; A_G] with g the
    // [N, G r] of every target's s dy B; otherwise one target at a time.
    // `write`: the adapters write y (dx) instead of adding to it, which writes_whole must allow.
    void forward_matrix(int l, const LoraTarget* targets, const int64_t* cols, int n, void* y, int64_t ldy,
                        const void* x, int N, bool training, bool write = false);
    void backward_matrix(int l, const LoraTarget* targets, const int64_t* cols, int n, void* dx, const void* dy,
                         int64_t ldy, const void* x, int N, bool write = false);
    // Whether the adapters of one fused matrix (targets as for forward_matrix) cover all of its output
    // and input gradient, with no dropout: then they can run first and write y and dx, and the frozen
    // base's GEMM accumulate onto them (beta = 1, read in its epilogue) instead of a thin GEMM reading and
    // writing y / dx again after it (docs/perf-notes.md, session 23's lever 5).
    bool writes_whole(int l, const LoraTarget* targets, int n) const;
    // A training pass has ended: the dropout masks move on (the device count and the host's, which a
    // checkpoint records). With W data-parallel ranks both move on by W: the host's counts the global
    // passes and rank r's device count is it + r, so rank r draws the masks of the global micro-batch
    // it trains (CpuLora::end_pass), the masks one rank draws on the same global batch.
    void end_pass();
    // Data parallel (set_communicator; world 1 without one): this rank's place among the ranks, and
    // ZeRO-1/2 of the adapters. Rank r owns the block param_shard(layout().total, W, r) of the flat
    // space and keeps only its master and moments (gpu_buffers.cpp); the gradient the backward
    // accumulates and the model-dtype weights are whole on every rank.
    void set_communicator(comm::Communicator* comm, int zero_level);
    const ParamShard& shard() const { return shard_; }

    // ---- --train-also (LoraOptions::train_also): base tensors trained in full ----
    // Their fp32 master, gradient and moments are the adapters' (layout().specs after first_trained);
    // the base's model-dtype weights the forward reads are theirs rounded to nearest, written after each
    // update and each upload_from_host (so a resume or a set value reaches the forward, and a resume
    // in bf16 reads the bits the uninterrupted run read). bind_base: the base's flat weights and each
    // trained tensor's offset there (layout().trained_base order); unbound (before it), nothing is written.
    // `after_write` (may be empty) runs on the stream after each such write: what the model derives from
    // the written values (an FP8 LM head's codes).
    void bind_base(void* weights, std::vector<int64_t> offsets, std::function<void()> after_write = {});
    // ZeRO-3 of the bf16 base: the bound weights are this rank's block, [begin, end) of the flat space
    // (element 0 = begin), so each write lands the part of each trained tensor inside it, and the
    // host mirror reads the tensors whole through `gather` (Weights::gather_range: collective, every
    // rank reads in the same order). Until it is set, a block-bound base (`whole` false) is neither
    // written nor read: the model binds the block once its communicator is known.
    struct BaseBlock {
        bool whole = true;
        int64_t begin = 0, end = 0;
        std::function<void(int64_t lo, int64_t hi, void* device_dst)> gather;
    };
    void set_base_block(BaseBlock block) { block_ = std::move(block); }
    // The fp32 gradient of base tensor `hf_name` (HF name) when --train-also trains it, else null.
    float* trained_grad(const std::string& hf_name) const;
    // The host mirror's --train-also values <- the bound base's weights (the start: they begin as the
    // base), or only base tensor `hf_name`'s (a value set through the base: the others keep their fp32
    // masters, which the base holds rounded). Under ZeRO-3 it stages the gathered base in the gradient
    // buffer: an upload_from_host must follow (it zeroes that buffer).
    void read_base_into_host(const std::string& hf_name = "");

    // ---- optimizer ----
    // This rank's block of the gradient summed over the ranks in rank order (ZeRO-1: the whole
    // all-reduced in place; ZeRO-2: reduce-scattered in place to the blocks' owners: the same bits),
    // then the block's sums of squares into partials + rank x K, all-gathered: `partials` holds
    // cuda::norm_partials_count() x world floats, the same on every rank. Without ranks: the whole
    // gradient's, as before.
    void reduce_and_sum_squares(float* partials);
    // AdamW over this rank's block (every adapter's and --train-also tensor's elements there; weight
    // decay as the run's for the matrices, the CPU's CpuLora::adamw for the rest: ParamSpec::decay);
    // clip: the device-side [norm, factor]. The model-dtype weights of every block are then
    // all-gathered, the bound base gets the new --train-also values and the gradient starts the next
    // step at zero.
    void update(const cuda::AdamWArgs& args, const float* clip);
    void zero_grads();

    // ---- host state (init, files, tests) ----
    // The host mirror: CpuLora's layout, initialisation and files.
    CpuLora& host() { return host_; }
    const CpuLora& host() const { return host_; }
    // Device master, moments and pass count <- the host mirror (the gradient becomes zero).
    void upload_from_host();
    // The host mirror's values and moments <- the device (the pass count is kept on the host).
    // Collective with several ranks (each holds its block of the master and moments): every rank
    // calls it, and every rank's mirror gets the whole state.
    void download_to_host() const;
    // One adapter tensor by its PEFT name: values (master), gradient, or a moment. With several ranks the
    // master and moments come through the host mirror (download_to_host): collective, every rank calls it.
    enum class Which { Master, Grad, AdamM, AdamV };
    std::vector<float> download(const std::string& name, Which which) const;

private:
    // The targets of one fused matrix that have an adapter in layer l, with their output columns.
    struct Adapted {
        LoraTarget targets[3];
        int64_t cols[3];
        int n = 0;
    };
    Adapted adapted(int l, const LoraTarget* targets, const int64_t* cols, int n) const;
    int64_t spec_index(const std::string& name) const;
    // the model-dtype A and B of (l, t), and the saved u
    const void* A(int l, LoraTarget t) const;
    const void* B(int l, LoraTarget t) const;
    void* saved(int l, LoraTarget t) const;
    // the bound base's --train-also tensors <- their master, rounded to the model dtype (on the stream)
    void write_base();
    // drop(x) into the scratch (dropout on), else x
    const void* dropped(int l, LoraTarget t, const void* x, int64_t n, bool training);

    LoraBuffers buf_;
    ModelConfig config_;
    LoraOptions lora_;
    DType act_;
    LoraLayout layout_;
    GemmRunner& gemm_;
    cudaStream_t stream_;
    OpTimer& timer_;
    int64_t rows_;  // N of the planned micro-batch (the saved activations' rows)
    comm::Communicator* comm_ = nullptr;  // data parallel (set_communicator)
    int zero_level_ = 1;
    int world_ = 1;    // the ranks' passes (end_pass): 1 until set_communicator
    ParamShard shard_;
    void* base_ = nullptr;               // bind_base: the base's flat model-dtype weights
    std::function<void()> after_write_;  // bind_base's
    std::vector<int64_t> base_offsets_;  // per --train-also tensor: its offset there
    BaseBlock block_;                    // set_base_block's (whole by default)
    std::unique_ptr<OptimizerState> optimizer_;
    mutable CpuLora host_;
};

}  // namespace qtrain
