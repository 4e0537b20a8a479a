// Causal grouped-query attention on the GPU, forward and backward, reading the fused QKV projection.
//
// Layouts (fixed by the model):
//   qkv   [B*T, (Hq + 2*Hkv) * D]: row n = b*T + t holds [q (Hq*D) | k (Hkv*D) | v (Hkv*D)]
//   out   [B*T, Hq*D]             (dout likewise)
//   lse   [B, Hq, T] fp32: natural-log log-sum-exp of each row of scaled scores, saved for backward
//   dqkv  same layout as qkv; the backward WRITES every element (no accumulation)
// Query head h reads kv head h / (Hq / Hkv); scale 1/sqrt(D); causal (key s <= query t).
//
// Document masking (packed rows, Batch::positions): positions [B*T] int32 on the device, the RoPE
// position of every token (0 at each document's first token, +1 per token after it; documents are
// contiguous runs). Query t then sees keys t - positions[b*T + t] <= s <= t only: attention never
// crosses a document boundary. nullptr: plain causal (and the plain kernels, bit for bit). The
// kernels trust the form (0 <= positions[t] <= t, each run 0, 1, 2, ...): the caller checks it
// (CudaModel::upload_batch). Flash and the fp32 kernels mask per row; the cuDNN backend runs each
// document as one sequence of cuDNN's ragged batch (attention_ragged.h), up to shape.max_docs per row
// (which it needs > 0; the caller checks each row's count), and then writes lse token-major,
// [B*T, Hq], which only its own backward reads.
//
// Implementations behind one API:
//   BF16, AttentionBackend::Flash: our flash attention (tensor cores, mma.sync), bf16 in/out, fp32
//         softmax and accumulation.
//   BF16, AttentionBackend::Cudnn: cuDNN's fused flash attention (attention_cudnn.h; Hopper kernels),
//         same layouts, built with cuDNN's deterministic backward. Only where the build has it
//         (attention_backend_available); forward and backward of one step must use the same backend.
//   F32:  plain CUDA-core kernels, fp32 in/out, the debugging path that matches the CPU reference.
// Every backward is deterministic (bit-identical run to run). Ours: one kernel owns dK/dV per key
// block (looping over the group's query heads and the query blocks in a fixed order), another owns dQ
// per query block; no floating-point atomics anywhere.
//
// Plain C++: no CUDA types beyond cudaStream_t, so .cpp callers need no cuda_bf16.h. Pointers must be
// 16-byte aligned (qkv, out, dout, dqkv) and 4-byte aligned (lse, workspace); D must be 64 or 128.
// Unsupported shapes or dtypes throw qtrain::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace qtrain {

struct AttentionShape {
    int B, T, Hq, Hkv, D;
    // cuDNN with positions only: document slots per row of its ragged batch (attention_ragged.h);
    // 0 otherwise. The flash and fp32 kernels ignore it.
    int max_docs = 0;
};

// Which kernels run bf16 attention (fp32 always runs the CUDA-core kernels).
enum class AttentionBackend { Flash, Cudnn };

// True if `backend` can run on the current device in this build; otherwise false with the reason in
// *why (e.g. a build without the cuDNN frontend headers).
bool attention_backend_available(AttentionBackend backend, std::string* why = nullptr);

// out [B*T, Hq*D] and lse [B, Hq, T] from qkv. dtype: F32 or BF16 (qkv and out; lse is always fp32).
// amax (BF16 only; FP8 training): also *amax = max |out| as stored (Flash: fused into the epilogue,
// zeroed by the launcher, integer atomicMax on the |x| bit patterns as fp8.h's abs_max; Cudnn: one
// abs_max pass over out after the attention).
// workspace: Cudnn only (Flash needs none), sized by attention_backward_workspace_bytes.
// positions: document masking (see the top), or nullptr. Cudnn with positions: shape.max_docs > 0,
// and the workspace also holds the ragged index.
void attention_forward(DType dtype, void* out, float* lse, const void* qkv, const AttentionShape& shape,
                       cudaStream_t stream, float* amax = nullptr,
                       AttentionBackend backend = AttentionBackend::Flash, void* workspace = nullptr,
                       const int32_t* positions = nullptr);

// Bytes of scratch the backward needs, rounded up to 256; 0 if none. chunks must divide B (see
// attention_backward). Flash: rowsum(dout * out) per query row, fp32: B/chunks * Hq * T floats.
// Cudnn: the larger of what cuDNN's deterministic backward asks for on B/chunks sequences and what
// its forward asks for on all B (one buffer serves both; building the graphs to ask needs the GPU,
// see cudnn_attention_backward_workspace_bytes for the estimate without one). Cudnn with
// shape.max_docs > 0 (document masking): the ragged graphs' (B*max_docs sequences of up to T tokens)
// plus the ragged index.
std::size_t attention_backward_workspace_bytes(DType dtype, const AttentionShape& shape, int chunks = 1,
                                               AttentionBackend backend = AttentionBackend::Flash);

// dqkv (same layout and dtype as qkv) from dout, qkv and the forward's out and lse.
// chunks > 1 runs the backward over the batch in `chunks` consecutive groups of B/chunks sequences
// (chunks must divide B), reusing one workspace sized by attention_backward_workspace_bytes(..., chunks).
// Every sequence's attention is independent and the kernels index only within a sequence, so the
// result is bit-identical to chunks = 1; only the workspace (and the launch count) differs.
// positions: the forward's (document masking), or nullptr.
void attention_backward(DType dtype, void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, void* workspace, const AttentionShape& shape, cudaStream_t stream,
                        int chunks = 1, AttentionBackend backend = AttentionBackend::Flash,
                        const int32_t* positions = nullptr);

// Implementation entry points (already validated arguments); the functions above dispatch to them.
namespace detail {
// positions: null (plain causal) or the [s.B * s.T] positions of these sequences.
void flash_attention_forward(void* out, float* lse, const void* qkv, const AttentionShape& s, cudaStream_t stream,
                             float* amax, const int32_t* positions);
void flash_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                              float* delta, const AttentionShape& s, cudaStream_t stream, const int32_t* positions);
void fp32_attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& s,
                            cudaStream_t stream, const int32_t* positions);
void fp32_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             float* delta, const AttentionShape& s, cudaStream_t stream, const int32_t* positions);
}  // namespace detail

}  // namespace qtrain
