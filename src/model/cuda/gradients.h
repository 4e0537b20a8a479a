// The gradient role of the GPU model (docs/design.md, "GPU model roles"): where each parameter's
// gradient accumulates and how it reaches the optimizer. Flat: one buffer on the device. Streamed
// (--offload-gradients): the flat copy is in pinned host memory (fp32, or bf16 with
// --param-grad-dtype=bf16); each layer's backward accumulates into a zeroed device slot (two slots,
// l % 2) that the role's own stream copies (first micro-batch after an update) or adds into the host
// copy while the next layer computes; the non-layer gradients (embedding, final norm, LM head) sum on
// the device for the whole step (resident) and go to the host once, before the update. Untied models
// keep the embedding's out of them: its backward adds into the host copy directly
// (embedding_on_host). The same additions in the same order as the flat buffer: bit-identical (bf16
// host gradients round, by construction). Its memory is bound by bind_gpu_buffers; its stream, events
// and slot state are its own.
//
// bf16 gradients on the device (--param-grad-dtype=bf16 without --offload-gradients, gradients_staged in
// gpu_buffers.h): the same staging with the flat bf16 copy in device memory: the same kernels, seeds and
// order as the host copy, so the same bits (for untied models the host path adds the embedding's rows
// into its host copy directly; here they are summed in the resident buffer and rounded once, like the
// final norm and the head). The flat copy takes 2 bytes a parameter instead of fp32's 4, the two slots
// and the resident non-layer gradients stay fp32.
//
// ZeRO-2 (gradients_reduced_per_layer, gpu_buffers.h): the same two device slots and resident buffer,
// all on the device, but a layer's flush reduces the slot over the ranks (Communicator::reduce, rank
// order) to the rank owning each part of its range, which adds it into its block of the gradient (the
// only flat gradient it keeps); the non-layer gradients are reduced the same way in prepare_update. At
// one micro-batch per step the block holds the bits of ZeRO-1's all-reduce (0 + sum is exact); with
// more, each micro-batch's sum is added in turn, so the order of the additions differs from ZeRO-1's
// (local sums first) and the two agree to rounding.
//
// ZeRO-1 (and ZeRO-2 under CUDA graphs, where the per-layer reductions would be captured): the whole
// gradient accumulates as on one GPU and reduce_over_ranks sums it after the backward, by one
// all-reduce in place (ZeRO-1) or one reduce-scatter into the rank's block (ZeRO-2). So every data-
// parallel reduction of the gradient is this role's, whatever the ZeRO level.
//
// CUDA graphs (--use-cuda-graphs with --offload-gradients, one GPU): the flushes are captured as a
// branch of the step's graph, forked and joined by the same events (join(), cuda/pass_event.h). The
// one choice that changes between micro-batches -- copy into the host copy (the first after an
// update) or add to it -- is then read on the device from a flag (GpuBuffers::step_scalars[3]) that
// finish_update / clear set and the end of each backward clears, so one captured backward replays
// correctly; the copy is a kernel's then (the same bits as the copy engine's).
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "cuda/op_timer.h"
#include "cuda/pass_event.h"
#include "cuda/stream.h"
#include "model/cuda/gpu_buffers.h"
#include "model/cuda/gpu_layout.h"
#include "model/cuda/param_shard.h"
#include "model/model_config.h"
#include "model/model_options.h"

namespace qtrain {

class Gradients {
public:
    // `rounding_seed`: the seed of the bf16 host sums' stochastic rounding; `compute`: the model's
    // compute stream, which every call below orders against; `timer`: the model's per-op timer.
    Gradients(const GpuBuffers& buffers, const GpuParamLayout& layout, const ModelConfig& config,
              const ModelOptions& options, uint32_t rounding_seed, cudaStream_t compute, OpTimer& timer);
    ~Gradients();
    Gradients(const Gradients&) = delete;
    Gradients& operator=(const Gradients&) = delete;

    bool streamed() const { return streamed_; }
    // ZeRO-2: this rank keeps its block of the gradient only (flat() is that block), reduced per
    // layer over `comm` (set before the first backward).
    bool reduced_per_layer() const { return per_layer_; }
    // Data parallel: `comm` is the world, `shard` this rank's block, `zero_level` 1 (all-reduce after
    // the backward) or 2 (the block only: per layer, or one reduce-scatter under CUDA graphs) or 3
    // (as 2). Set before the first backward.
    void set_communicator(comm::Communicator* comm, const ParamShard& shard, int zero_level);
    // After the backward, on the compute stream: the gradient of this rank's block summed over the
    // ranks (see the top of this file). Returns the block: shard.size elements of type().
    void* reduce_over_ranks();
    bool embedding_on_host() const { return embedding_on_host_; }
    void* flat() const { return flat_; }  // the whole flat gradient (pinned host memory when streamed)
    DType type() const { return type_; }
    uint32_t rounding_seed() const { return seed_; }
    // The host copy holds nothing of this step yet (the next layer flush copies instead of adding).
    bool host_fresh() const { return host_fresh_; }

    // Where the gradient of flat element `off` accumulates during the backward (fp32): the flat
    // buffer, or (streamed) the device slot of its layer / the resident buffer.
    float* at(int64_t off) const;
    // A non-layer gradient that is still on the device (streamed, not the host-summed embedding).
    bool on_device_until_update(int64_t off) const;

    // Whether each layer matrix's gradient is written whole by its one weight-gradient GEMM of the
    // micro-batch (beta = 0) rather than added to what is there: staged, the layer's slot starts every
    // micro-batch empty, so begin_layer zeroes only its norm weights, biases and padding and the
    // GEMMs write the rest (a fp32 write instead of a read-modify-write and a memset). 0 + x = x, so
    // the same bits as adding onto zeros.
    bool matrices_written_whole() const { return streamed_; }
    // Layer l's backward is about to accumulate into its slot / has finished with it.
    void begin_layer(int l);
    void flush_layer(int l);
    void end_backward();  // every layer of this backward has been flushed (queued)
    // Before the optimizer reads the flat gradient: the compute stream waits for the layer flushes, a
    // step without backward reads zeros, and the resident gradients go to the host.
    void prepare_update();
    // After the update: the gradients start the next step at zero.
    void finish_update();
    // Zero everything (initialisation, loading a checkpoint).
    void clear();
    void sync() const;  // waits for the role's stream
    // The compute stream waits for every flush queued so far, and the events are settled
    // (cuda/pass_event.h): CUDA graphs, before a pass (outside a capture) and at its end (inside).
    void join();
    // A captured backward was replayed: the host-side bookkeeping its end_backward did at capture.
    void backward_replayed() { host_fresh_ = false; }

private:
    void set_fresh_flag();  // CUDA graphs: the next backward's flushes copy (on the compute stream)
    void zero_resident();
    void zero_flat();
    // Sums src[0, n) — the gradient of flat elements [begin, begin + n) — over the ranks into the
    // blocks of the ranks owning them, on `stream` (ZeRO-2).
    void reduce_to_owners(const float* src, int64_t begin, int64_t n, cudaStream_t stream);

    const GpuParamLayout& layout_;
    void* flat_ = nullptr;
    float* resident_ = nullptr;
    float* slots_[2] = {nullptr, nullptr};
    std::vector<GpuParamLayout::Range> zeroed_runs_;  // of a layer's slot, from its start: all but the matrices
    DType type_ = DType::F32;
    bool streamed_ = false, embedding_on_host_ = false;
    bool per_layer_ = false;  // ZeRO-2 (streamed_ too: the slots and the resident buffer)
    bool offloaded_ = false;  // flat_ is in pinned host memory (--offload-gradients)
    comm::Communicator* comm_ = nullptr;
    ParamShard shard_;
    int zero_level_ = 1;
    OpTimer& timer_;
    float* tmp_ = nullptr;  // a layer span: a reduction's sum, before it is added to the block
    int64_t flat_elements_ = 0;  // of flat_: the layout's total, or (ZeRO-2) one rank's block
    uint32_t seed_ = 0;
    cudaStream_t compute_ = nullptr;
    cuda::Stream stream_;
    cuda::PassEvent ready_[2], free_[2];
    cuda::Event done_, joined_;
    bool host_fresh_ = true;
    // CUDA graphs: the flushes read "the host copy holds nothing of this step" from this device flag
    // (nonzero: fresh) instead of host_fresh_; null without graphs or offload.
    int32_t* fresh_flag_ = nullptr;
};

}  // namespace qtrain
