// The fp32 reference ops of a Qwen2 forward and backward pass, one function per direction. They are
// the oracle every GPU kernel test compares against, so they take raw pointers and sizes (no model,
// no Tensor) and use the layouts the GPU kernels use:
//   activations [N = B*T, C] row-major; Linear weights in HF layout [out, in];
//   q/k/v/attention output [B, T, H, D] (= the [N, H*D] output of the projection, unchanged).
// Conventions:
//   - every backward ADDS (+=) into its gradient outputs (so callers can sum several paths into one
//     buffer, as the residual stream and tied embeddings need); callers zero them first. The one
//     exception is rope_backward, which writes and may run in place.
//   - results are deterministic: loops run in parallel over independent outputs only, and every
//     output is summed in a fixed order (OpenBLAS sgemm is deterministic at a fixed thread count).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/dtype.h"
#include "model/model_config.h"

namespace qtrain::cpu {

// ---- matmul (cpu_matmul.cpp) ----

// C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C, row-major; op transposes when trans_* is set
// (then A is stored [K,M] / B is stored [N,K]). cblas_sgemm when built with BLAS, loops otherwise.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);

// out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC] (bias may be null).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC, int OC);
// dinp[N,IC] += dout @ weight; dweight[OC,IC] += dout^T @ inp; dbias[OC] += column sums of dout.
// Any of dinp, dweight, dbias may be null.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC);

// ---- elementwise and row ops (cpu_ops.cpp) ----

// out[n,:] = table[tokens[n],:]. Tokens must lie in [0, V) (the caller validates).
void embedding_forward(float* out, const int32_t* tokens, const float* table, int N, int C);
// dtable[tokens[n],:] += dout[n,:], in token order (repeated tokens sum deterministically).
// Positions holding `skip_token` add nothing (the config's pad_token_id, HF's padding_idx; -1 = none).
void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int N, int C, int32_t skip_token = -1);

// HF Qwen2RMSNorm in fp32: out = weight * (x * rstd), rstd = 1/sqrt(mean(x^2) + eps), per row.
// rstd[N] is saved for the backward.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C);

// out = a + b (the residual stream).
void residual_forward(float* out, const float* a, const float* b, int64_t n);

// SwiGLU MLP activation: out = silu(gate) * up, silu(g) = g * sigmoid(g).
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);

// ---- RoPE (cpu_ops.cpp) ----

// cos/sin tables [T, D/2] as HF Qwen2RotaryEmbedding builds them, all in float:
// inv_freq[i] = 1 / theta^(2i/D), angle = t * inv_freq[i] for positions t = 0..T-1.
void rope_tables(float* cos, float* sin, int T, int D, double theta);
// The model's frequencies (plain, or Llama 3's scaled ones, ModelConfig::rope_type), as
// transformers' rope_init_fn computes them in float32; and its tables [T, head_dim/2].
std::vector<float> rope_inv_freq(const ModelConfig& cfg);
void rope_tables(float* cos, float* sin, int T, const ModelConfig& cfg);
// Rotate-half RoPE on x [B, T, H, D]: pairs (i, i + D/2) rotate by angle(p, i) where p is the token's
// position: t, or positions[b*T + t] when positions (Batch::positions, each < T) is given. In place
// allowed.
void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int B, int T, int H, int D,
                  const int32_t* positions = nullptr);
// The inverse rotation of the gradient. WRITES dinp (not +=); in place allowed.
void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int B, int T, int H, int D,
                   const int32_t* positions = nullptr);

// ---- causal GQA attention (cpu_attention.cpp) ----

// q, out [B, T, Hq, D]; k, v [B, T, Hkv, D]; query head h reads kv head h / (Hq / Hkv); scale 1/sqrt(D).
// lse [B, Hq, T] receives the log-sum-exp of each softmax row (scaled scores), which is all the
// backward needs to recompute the probabilities (as flash attention does).
// positions (Batch::positions, [B*T], may be null): document masking — query t sees keys
// t - positions[b*T + t] .. t only (its own document); null = plain causal (keys 0..t).
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int B, int T, int Hq,
                       int Hkv, int D, const int32_t* positions = nullptr);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* lse, int B, int T, int Hq, int Hkv, int D,
                        const int32_t* positions = nullptr);

// ---- cross-entropy and the fused LM head (cpu_lmhead.cpp) ----

// Number of targets >= 0.
int count_valid_targets(const int32_t* targets, int N);
// Per row of logits [n, V]: losses[i] = logsumexp(row) - row[target]. When write_grad is set the row
// is overwritten with its gradient (softmax - onehot(target)) * dscale. Rows with target < 0 get
// loss 0 and a zero gradient. Throws if a target is >= V.
void softmax_cross_entropy(float* logits, float* losses, const int32_t* targets, int n, int V, float dscale,
                           bool write_grad);

// Rows per chunk when N tokens are split into `chunks` chunks (the last one may be shorter).
int lmhead_chunk_rows(int N, int chunks);
// LM head + softmax cross-entropy without ever holding all N*V logits: rows are processed
// lmhead_chunk_rows(N, chunks) at a time through `scratch` ([chunk_rows, V] floats).
// x [N, C] (final normed hidden states), weight [V, C], targets [N]; writes losses[N] (0 where masked).
// When dx or dweight is non-null the backward runs too, with dlogits = (softmax - onehot) * dscale:
// dx[N,C] += dlogits @ weight and dweight[V,C] += dlogits^T @ x (chunk by chunk, in order).
// fp8 (--lm-head-dtype=e4m3, emulated): the forward GEMM reads xq and wq instead, x and the weight
// rounded through e4m3 each with its per-tensor scale (fake_quantize); with grad = e4m3|e5m2 (FP8
// gradients) each chunk's dlogits is rounded through it with the chunk's own scale, as the GPU does,
// and the backward GEMMs read xq and wq too; with grad = fp32 they read the unquantised x and weight.
struct LmHeadFp8 {
    const float* xq = nullptr;
    const float* wq = nullptr;
    DType grad = DType::F32;
};
void lmhead_cross_entropy(float* losses, float* dx, float* dweight, const float* x, const float* weight,
                          const int32_t* targets, int N, int C, int V, int chunks, float dscale, float* scratch,
                          const LmHeadFp8* fp8 = nullptr);

// ---- FP8 emulation (cpu_fp8.cpp) ----

// Rounds the parts of one tensor (a fused group shares one per-tensor scale, from the amax over all
// parts) through `type` and back: out = decode(quantize(in * scale)) / scale, as the GPU's FP8
// GEMMs see their operands. out may alias in.
struct Fp8Part {
    const float* in;
    float* out;
    int64_t n;
};
void fake_quantize(std::initializer_list<Fp8Part> parts, DType type);

// ---- optimizer (cpu_ops.cpp) ----

// Sum of squares in double, over fixed blocks summed in order: deterministic at any thread count.
double sum_squares(const float* x, int64_t n);
// One AdamW step on n elements (torch.optim.AdamW semantics): g = grad * grad_scale (the clip
// factor), m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, m_hat = m / (1-b1^step), v_hat = v / (1-b2^step),
// param -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * param). step is 1-based.
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int step);

}  // namespace qtrain::cpu

namespace qtrain::cpu {

// ---- LoRA (cpu_lora_ops.cpp) ----

// One adapter on a Linear with input x [N, IC] and output y [N, OC]: A [r, IC], B [OC, r], scale s.
// h[N, r] = x A^T (saved for the backward); y += s * h B^T (added to the base's output).
void lora_forward(float* y, float* h, const float* x, const float* A, const float* B, int N, int IC, int OC, int r,
                  float scale);
// dh[N, r] = s * dy B (scratch, written); dB += s * dy^T h; dA += dh^T x; dx += dh A.
// dx may be null (no input gradient wanted).
void lora_backward(float* dx, float* dA, float* dB, float* dh, const float* dy, const float* x, const float* h,
                   const float* A, const float* B, int N, int IC, int OC, int r, float scale);

}  // namespace qtrain::cpu
