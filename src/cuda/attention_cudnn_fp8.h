// cuDNN's FP8 fused attention (the frontend's sdpa_fp8 / sdpa_fp8_backward) on the packed layouts of
// attention.h, with every tensor in FP8 instead of bf16: q, k, v and O as e4m3 codes, dO and dq, dk, dv
// as e4m3 or e5m2 codes, each with a per-tensor scale, and the softmax probabilities P and their
// gradient dP quantised inside the kernels with scales the caller gives. lse stays fp32.
//
// Why: attention is ~10% of a 7B LoRA step and ~70% of a 0.5B step at seq 16384 (docs/perf-notes.md,
// session 23). Not used by the model yet: attention_bench --fp8 measures what it would save and
// attention_cudnn_fp8_test checks it against the CPU reference first.
//
// What cuDNN allows on Hopper (its frontend 1.32's checks): head dim <= 256 in the forward, exactly 128
// in the backward; FP8 outputs only (bf16 O / dq / dk / dv need Blackwell); causal (top-left) masks; no
// ragged (document-masked) backward. A refused shape throws with cuDNN's reason when its graph is built
// (the workspace query).
//
// Scales are device pointers to one fp32 each (they may point into one array): `descale_x` turns x's
// codes into values (x = code * descale_x), `scale_x` values into codes (code = x * scale_x); the kernels
// write the `amax_*` of what they produce, from which the next call's scales follow (delayed scaling).
#pragma once

#include <cstddef>
#include <string>

#include <cuda_runtime.h>

#include "core/dtype.h"
#include "cuda/attention.h"

namespace qtrain::detail {

struct CudnnFp8ForwardScales {
    const float* descale_q = nullptr;
    const float* descale_k = nullptr;
    const float* descale_v = nullptr;
    const float* descale_s = nullptr;  // P's codes (P in [0, 1]: a fixed scale of 448 fits e4m3)
    const float* scale_s = nullptr;
    const float* scale_o = nullptr;
    float* amax_s = nullptr;  // written
    float* amax_o = nullptr;  // written
};

struct CudnnFp8BackwardScales {
    const float* descale_q = nullptr;
    const float* descale_k = nullptr;
    const float* descale_v = nullptr;
    const float* descale_o = nullptr;
    const float* descale_do = nullptr;
    const float* descale_s = nullptr;
    const float* descale_dp = nullptr;
    const float* scale_s = nullptr;
    const float* scale_dq = nullptr;
    const float* scale_dk = nullptr;
    const float* scale_dv = nullptr;
    const float* scale_dp = nullptr;
    float* amax_dq = nullptr;  // written
    float* amax_dk = nullptr;
    float* amax_dv = nullptr;
    float* amax_dp = nullptr;
};

// out [B*T, Hq*D] e4m3 codes; lse [B, Hq, T] fp32 (as attention.h); qkv [B*T, (Hq + 2 Hkv) * D] e4m3 codes.
void cudnn_fp8_attention_forward(void* out, float* lse, const void* qkv, const CudnnFp8ForwardScales& scales,
                                 void* workspace, const AttentionShape& s, cudaStream_t stream);
// dqkv [B*T, (Hq + 2 Hkv) * D] and dout [B*T, Hq*D] codes of grad_type (E4M3 or E5M2); qkv, out e4m3.
void cudnn_fp8_attention_backward(void* dqkv, const void* dout, DType grad_type, const void* qkv, const void* out,
                                  const float* lse, const CudnnFp8BackwardScales& scales, void* workspace,
                                  const AttentionShape& s, cudaStream_t stream);

// Their workspaces (building the graph: throws with cuDNN's reason where the shape is refused). Without
// a GPU (or a build without the frontend) they throw.
std::size_t cudnn_fp8_attention_forward_workspace_bytes(const AttentionShape& s);
std::size_t cudnn_fp8_attention_backward_workspace_bytes(const AttentionShape& s, DType grad_type);

// The frontend's own checks of both graphs for a GPU of compute capability sm_version (e.g. 90), without
// building them on a device: "" when they pass, else the first graph's reason. Runs without a GPU (what
// a CPU-only machine can check of this file); a build without the frontend returns its reason.
std::string cudnn_fp8_attention_validate(const AttentionShape& s, DType grad_type, int sm_version);

}  // namespace qtrain::detail
