// The cuDNN backend of attention.h: cuDNN's fused flash attention (SDPA), built through the cuDNN
// frontend's graph API on the same packed layouts (qkv, out, lse, dqkv) as the flash kernels, so the
// two backends are interchangeable behind attention_forward/attention_backward.
//
// Why: on Hopper cuDNN runs attention with wgmma/TMA kernels, which our mma.sync kernels do not use.
// The backward is built with cuDNN's deterministic algorithm (bit-identical run to run; qtrain's
// recompute/offload/graph tests compare losses bit for bit), which needs a workspace that cuDNN sizes
// (for the dP matrix, B*Hq*T*T bf16 at most): cudnn_attention_backward_workspace_bytes asks it.
//
// Compiled only when CMake finds the frontend headers (scripts/fetch_cudnn_frontend.sh) and libcudnn;
// otherwise cudnn_attention_available() says why not and the other functions throw.
// Graphs are built once per thread, device and shape and cached (building takes ~0.1–1 s).
#pragma once

#include <cstddef>
#include <string>

#include <cuda_runtime.h>

#include "cuda/attention.h"
#include "cuda/attention_ragged.h"

namespace qtrain::detail {

// True when this build has the cuDNN backend compiled in (it may still not run: see below).
bool cudnn_attention_compiled();

// The version of the libcudnn this process loaded (cudnnGetVersion, e.g. "9.19.0"), or "" without the
// backend: which library ran is what a timing of the cuDNN paths depends on (LD_LIBRARY_PATH picks it).
std::string cudnn_runtime_version();

// True when this build has the cuDNN backend and cuDNN can be loaded on the current device; otherwise
// false with the reason in *why.
bool cudnn_attention_available(std::string* why = nullptr);

// bf16 only. lse as in attention.h (natural-log log-sum-exp of the scaled scores, [B, Hq, T] fp32).
// workspace: at least cudnn_attention_forward_workspace_bytes(s) bytes (may be null when that is 0).
void cudnn_attention_forward(void* out, float* lse, const void* qkv, void* workspace, const AttentionShape& s,
                             cudaStream_t stream);

// Workspace of the forward for shape s (a few hundred bytes; without a GPU, 4 KiB as an estimate).
std::size_t cudnn_attention_forward_workspace_bytes(const AttentionShape& s);

// Workspace of the backward for shape s: as cuDNN reports it for its deterministic algorithm when a
// GPU is visible; without one (--plan-only on a machine without a GPU) the estimate below.
std::size_t cudnn_attention_backward_workspace_bytes(const AttentionShape& s);

// What the deterministic backward asks for, from the frontend's sizing of its decomposed graph
// (dP as bf16 [B, Hq, T rounded up to 64, T rounded up to 64], the softmax row sums and, for GQA, dK and
// dV at full head count in bf16) plus 1 MiB for the engine's own scratch. Used only without a GPU.
std::size_t cudnn_attention_backward_workspace_estimate(const AttentionShape& s);

// dqkv written in full; workspace of at least cudnn_attention_backward_workspace_bytes(s) bytes.
void cudnn_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                              void* workspace, const AttentionShape& s, cudaStream_t stream);

// Document masking (positions) on cuDNN: variable-length SDPA with a padding mask, seq_len_q/kv and
// ragged offsets on q, k, v, o, lse (and dO, dq, dk, dv), one sequence per document: s.B*s.max_docs
// sequences of up to s.T tokens, causal within each (attention_ragged.h gives the index and why the
// count is fixed). idx: the index of exactly these s.B rows (a group of attention_ragged.h), already
// written on `stream`. lse is token-major [s.B*s.T, s.Hq]. Graphs are cached per shape including
// max_docs, so the documents of a micro-batch change nothing but the index's values.
void cudnn_ragged_attention_forward(void* out, float* lse, const void* qkv, const cuda::RaggedIndex& idx,
                                    void* workspace, const AttentionShape& s, cudaStream_t stream);
void cudnn_ragged_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                                     const cuda::RaggedIndex& idx, void* workspace, const AttentionShape& s,
                                     cudaStream_t stream);
// Workspaces of the ragged graphs (as the plain ones: cuDNN's figure with a GPU, else the estimate
// for s.B*s.max_docs sequences of s.T tokens).
std::size_t cudnn_ragged_attention_forward_workspace_bytes(const AttentionShape& s);
std::size_t cudnn_ragged_attention_backward_workspace_bytes(const AttentionShape& s);

}  // namespace qtrain::detail
