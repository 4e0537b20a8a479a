// The optimizer-state role of the GPU model (docs/design.md, "GPU model roles"): Adam's moments over
// the flat parameter space (on the device, or in pinned host memory with --offload-opt-m/v), the
// weight-decay segment table, and the AdamW update over them — one zero-copy launch, or with
// --offload-double-buffer a chunked pipeline on the role's own two copy streams. Its memory is carved
// from the arenas by bind_gpu_buffers (GpuBuffers::opt, so the plan counts it); its streams, events
// and staging slots are its own. Under data parallel (ZeRO-1/2) the role holds a rank's block of the
// flat space only (param_shard.h): its moments are that block's, and update() runs over it.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/kernels.h"
#include "cuda/stream.h"
#include "model/cuda/gpu_buffers.h"
#include "model/model_options.h"

namespace qtrain {

class OptimizerState {
public:
    // The flat arrays AdamW reads and writes besides the moments, each pointing at the first element
    // of the range update() runs over.
    struct Params {
        float* master = nullptr;   // fp32 master weights; null with --master-dtype=bf16
        const void* grads = nullptr;
        void* weights = nullptr;   // model-dtype weights; null when they are the master (fp32 model)
    };

    OptimizerState(const OptimizerBuffers& buffers, const ModelOptions& options);
    ~OptimizerState();
    OptimizerState(const OptimizerState&) = delete;
    OptimizerState& operator=(const OptimizerState&) = delete;

    void* m() const { return buf_.adam_m; }
    void* v() const { return buf_.adam_v; }
    int64_t elements() const { return buf_.elements; }  // of m and v

    // The weight-decay segments (one per tensor, sorted by offset), copied to the device on `stream`.
    void upload_segments(const std::vector<cuda::ParamSegment>& segments, cudaStream_t stream);

    // AdamW over the flat elements [begin, end) on `stream` (the whole space, or a rank's block: at
    // most elements() of them; m and v element 0 is `begin`). clip: the device-side [norm, clip
    // factor] of the global norm; weight_amax: the FP8 weights' abs-max slots AdamW folds into, or
    // null. What is queued on `stream` afterwards sees the updated state, staged or not.
    void update(const cuda::AdamWArgs& args, const Params& params, int64_t begin, int64_t end, const float* clip,
                float* weight_amax, cudaStream_t stream);

private:
    void update_staged(const cuda::AdamWArgs& args, const Params& params, int64_t begin, int64_t end,
                       const float* clip, float* weight_amax, cudaStream_t stream);

    OptimizerBuffers buf_;
    DType m_type_, v_type_, grad_type_, model_type_;
    bool staged_ = false;  // --offload-double-buffer with something offloaded
    cuda::Stream in_stream_, out_stream_;
    cuda::Event start_, in_done_[2], computed_[2], out_done_[2];
};

}  // namespace qtrain
