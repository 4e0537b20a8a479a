// Host-side launchers of the elementwise and reduction kernels of the GPU model, one .cu file per
// op family. Plain C++: callers need no CUDA headers beyond cudaStream_t. `act` selects the
// activation type (DType::F32 or DType::BF16) of every void* activation/weight argument; gradients
// of parameters are always fp32 (float*), accumulated (+=) so micro-batches sum in place.
// Every kernel is deterministic (no floating-point atomics; fixed reduction orders).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace qtrain::cuda {

// ---- embedding.cu ----
// out[n, :] = table[tokens[n], :]
void embedding_forward(DType act, void* out, const int32_t* tokens, const void* table, int N, int C, cudaStream_t s);
// dtable[tok, :] += sum over positions with that token of dout[pos, :], in increasing position
// order. The host groups positions by token (embedding_backward_plan): unique_tokens[u] has its
// positions at positions[offsets[u] .. offsets[u+1]). The count of distinct tokens is read on the
// device (*num_unique <= max_unique), so a captured CUDA graph serves every micro-batch.
// table_type F32: plain fp32 adds (device or mapped pinned memory). BF16 (mapped pinned host
// gradients, --param-grad-dtype=bf16): each touched element becomes bf16(its value + the sum),
// rounded stochastically with the bits accumulate_bf16 uses for flat index index_base + i and `seed`.
void embedding_backward(void* dtable, DType table_type, DType act, const void* dout, const int32_t* unique_tokens,
                        const int32_t* offsets, const int32_t* positions, const int32_t* num_unique, int max_unique,
                        int C, cudaStream_t s, uint64_t index_base = 0, uint32_t seed = 0);

// ---- rmsnorm.cu ----
// res_out = res_in (+ delta when delta != null; res_out may alias res_in), then
// norm_out = weight * (res_out * rstd), rstd = 1/sqrt(mean(res_out^2) + eps) saved per row.
// amax (optional, FP8): set to max |norm_out| of the stored values (the launcher zeroes it first).
void residual_rmsnorm_forward(DType act, void* res_out, void* norm_out, float* rstd, const void* res_in,
                              const void* delta, const void* weight, int N, int C, float eps, cudaStream_t s,
                              float* amax = nullptr);
// dres[n,:] += d(norm)/d(inp) applied to dnorm; dweight[C] += sum_n dnorm * inp * rstd.
// `scratch` needs rmsnorm_backward_scratch_floats(N, C) floats (per-block partial weight sums).
// dweight null (a frozen weight, LoRA): no weight gradient; the partials' reduction is skipped (the
// fused kernel still writes its per-block partials to scratch).
std::size_t rmsnorm_backward_scratch_floats(int N, int C);
// amax (optional, FP8): set to max |dres| of the stored (updated) values.
void rmsnorm_backward(DType act, void* dres, float* dweight, float* scratch, const void* dnorm, const void* inp,
                      const void* weight, const float* rstd, int N, int C, cudaStream_t s, float* amax = nullptr);

// ---- rope.cu ----
// Rotate-half RoPE on the q and k heads of the fused qkv buffer [B*T, (Hq + 2 Hkv) * D], in place.
// cos_sin: [T, D/2] cos table followed by [T, D/2] sin table (fp32; built on the host exactly as HF).
// positions (document masking, [B*T] int32 on the device, each in [0, T); may be null): token n rotates
// by the angle of positions[n] instead of its index in the row, n % T.
void rope_forward(DType act, void* qkv, const float* cos_sin, int B, int T, int Hq, int Hkv, int D, cudaStream_t s,
                  const int32_t* positions = nullptr);
// The inverse rotation applied to the q and k gradients of dqkv, in place.
// amax (FP8 gradients; may be null): *amax = max |dqkv| as stored over the whole tensor (q, k and the
// untouched v part), for the QKV projection's gradient quantisation.
void rope_backward(DType act, void* dqkv, const float* cos_sin, int B, int T, int Hq, int Hkv, int D, cudaStream_t s,
                   float* amax = nullptr, const int32_t* positions = nullptr);

// ---- qk_norm_rope.cu ----
// Qwen3: per-head RMSNorm of the q and k heads (q_norm / k_norm over the head dim D, weights q_w and
// k_w [D] in the act type, shared by all heads of their role), then rotate-half RoPE, in place on the
// fused qkv buffer [B*T, (Hq + 2 Hkv) * D] (v untouched); cos_sin as for rope_forward. Per head row,
// in fp32 from the pre-norm value, rounded to the act type once: qkv = rope(w * (x * rstd)),
// rstd = 1/sqrt(mean(x^2) + eps). Kept for the backward: qk_pre [B*T, (Hq + Hkv) * D] (act type) =
// the pre-norm q|k heads of each token, exactly as they were stored, and rstd [B*T, Hq + Hkv] (fp32).
// qk_pre and rstd may be null (a forward without backward). D even, at most 512. positions: as for
// rope_forward (document masking; may be null).
void qk_norm_rope_forward(DType act, void* qkv, void* qk_pre, float* rstd, const void* q_w, const void* k_w,
                          const float* cos_sin, int B, int T, int Hq, int Hkv, int D, float eps, cudaStream_t s,
                          const int32_t* positions = nullptr);
// The backward, in place on d_qkv: its q and k heads hold d(rope(norm(.))) and become d(pre-norm q|k)
// (inverse rotation, then the RMSNorm backward; written, not accumulated); its v heads are not touched.
// dw_q, dw_k [D] (fp32) += the weight gradients, deterministic (per-block partials in col_scratch,
// which needs qk_norm_rope_backward_scratch_floats(B, T, Hq, Hkv, D) floats, then a fixed-order sum);
// dw_q / dw_k null (frozen weights, LoRA): that sum is skipped.
// grad_amax (FP8 gradients; may be null) as rope_backward's amax: *grad_amax = max |d_qkv| as stored
// over the whole tensor (q, k and the untouched v part), for the QKV projection's gradient quantisation.
std::size_t qk_norm_rope_backward_scratch_floats(int B, int T, int Hq, int Hkv, int D);
void qk_norm_rope_backward(DType act, void* d_qkv, float* dw_q, float* dw_k, float* col_scratch, const void* qk_pre,
                           const float* rstd, const void* q_w, const void* k_w, const float* cos_sin, int B, int T,
                           int Hq, int Hkv, int D, cudaStream_t s, float* grad_amax = nullptr,
                           const int32_t* positions = nullptr);

// ---- swiglu.cu ----
// gate_up rows are [gate (I) | up (I)]; out[n, i] = silu(gate) * up.
// amax (optional, FP8): set to max |out| of the stored values (the launcher zeroes it first).
void swiglu_forward(DType act, void* out, const void* gate_up, int N, int I, cudaStream_t s, float* amax = nullptr);
// dgate_up[n, :] = [dout * up * silu'(gate) | dout * silu(gate)] (written, not accumulated);
// amax as in the forward, over all of dgate_up. dgate_up null: only the amax (the FP8 path then
// writes the gradients quantised with cuda::swiglu_backward_quantize_transpose, fp8.h).
void swiglu_backward(DType act, void* dgate_up, const void* dout, const void* gate_up, int N, int I, cudaStream_t s,
                     float* amax = nullptr);

// ---- bias_grad.cu ----
// dbias[C] += column sums of d[N, C]; scratch: bias_grad_scratch_floats(N, C) floats.
std::size_t bias_grad_scratch_floats(int N, int C);
void bias_grad(float* dbias, float* scratch, DType act, const void* d, int N, int C, cudaStream_t s);

// ---- cross_entropy.cu ----
// Per row of logits [n, V] (act type): loss[i] = logsumexp(row) - row[target[i]]; when write_grad,
// the row becomes (softmax - onehot(target)) * (*dscale) (in act type). target < 0: loss 0, grad 0.
// Scales are device pointers (they change per micro-batch; a CUDA graph captures the pointer).
void softmax_cross_entropy(DType act, void* logits, float* losses, const int32_t* targets, int n, int V,
                           const float* dscale, bool write_grad, cudaStream_t s);
// *acc += (*scale) * sum(losses[0..n)) in a fixed order (one block).
void accumulate_loss(float* acc, const float* losses, int n, const float* scale, cudaStream_t s);

// ---- optimizer.cu ----
// A contiguous run of the flat parameter buffer with its weight-decay flag.
struct ParamSegment {
    int64_t offset;
    int64_t size;
    int decay;
    int amax_slot = -1;  // FP8 weight: the slot its abs-max goes to (weight_amax + 4 * slot); -1: none
};
// sum of squares of grad[0..n) (fp32, or bf16 with --param-grad-dtype=bf16) -> partials (norm_partials_count() floats), then finalize writes
// out[0] = ||grad||_2 and out[1] = clip scale (max_norm / norm when norm > max_norm > 0, else 1).
int norm_partials_count();
void global_norm(float* out, float* partials, const void* grad, DType grad_type, int64_t n, float max_norm,
                 cudaStream_t s);
// global_norm's two halves, for data parallel: each rank writes the norm_partials_count() partial
// sums of squares of its block into partials; norm_from_partials sums `count` of them (every rank's,
// gathered in rank order) in double, in index order, and writes out as global_norm does. At one rank
// the two give global_norm's bits.
void sum_squares_partials(float* partials, const void* grad, DType grad_type, int64_t n, cudaStream_t s);
void norm_from_partials(float* out, const float* partials, int count, float max_norm, cudaStream_t s);
// AdamW over the segments (torch.optim.AdamW semantics, grads — fp32 or bf16 — scaled by clip[1] first). m and v are
// fp32 or bf16 (bf16 stored with stochastic rounding seeded by (seed, step, index)); master is fp32;
// the model-dtype copy `weights` (act type; may be null in fp32 mode when weights == master) is
// written from the updated master. master null (--master-dtype=bf16): the bf16 `weights` are the
// parameters, updated in place with stochastic rounding. Elements outside the segments are not touched.
// weight_amax (FP8; null: skipped): max |weight as stored| of each segment with amax_slot >= 0 is
// folded (integer atomicMax on the |x| bit patterns, as fp8.h's abs_max) into weight_amax[4 * slot],
// which the caller zeroes first; fused tensors (q|k|v, gate|up) share a slot.
struct AdamWArgs {
    float lr, beta1, beta2, eps, weight_decay;
    int step;
    uint64_t seed;
};
void adamw_update(const ParamSegment* segments_device, int num_segments, int64_t total_elements, float* master,
                  const void* grad, DType grad_type, void* m, DType m_type, void* v, DType v_type, void* weights, DType act,
                  const float* clip, const AdamWArgs& args, float* weight_amax, cudaStream_t s);
// The same update for the elements [begin, end) only (multiples of 4), with every array pointer
// pointing at element `begin` (a chunk staged on the device, or a resident buffer + begin): segments
// and stochastic-rounding bits use the absolute index, so chunked updates equal one whole update.
void adamw_update_range(const ParamSegment* segments_device, int num_segments, int64_t begin, int64_t end,
                        float* master, const void* grad, DType grad_type, void* m, DType m_type, void* v, DType v_type,
                        void* weights, DType act, const float* clip, const AdamWArgs& args, float* weight_amax,
                        cudaStream_t s);

// ---- convert.cu ----
// dst[i] = (dst_type) src[i] for fp32 -> {fp32, bf16}.
void convert_from_f32(void* dst, DType dst_type, const float* src, int64_t n, cudaStream_t s);
// dst[i] = float(src[i]) for {fp32, bf16} -> fp32.
void convert_to_f32(float* dst, const void* src, DType src_type, int64_t n, cudaStream_t s);
// Zeroes `bytes` bytes at p (16-byte aligned) with a kernel: also for mapped pinned host memory
// (offloaded buffers), where it writes over PCIe without stopping the host.
void fill_zero(void* p, std::size_t bytes, cudaStream_t s);
// dst[i] += src[i] (fp32, n a multiple of 4, 16-byte aligned): the offloaded gradients of a layer
// accumulated from its device staging slot (dst in mapped pinned host memory).
void add_f32(float* dst, const float* src, int64_t n, cudaStream_t s);
// add_f32, or where *copy (device memory) is nonzero dst[i] = src[i], bit for bit a copy: the first
// micro-batch's flush of an offloaded gradient under CUDA graphs, where a replayed graph must read
// the choice on the device.
void add_f32_or_copy(float* dst, const float* src, int64_t n, const int32_t* copy, cudaStream_t s);
// --param-grad-dtype=bf16: dst[i] = round(src[i]) (overwrite) or round(float(dst[i]) + src[i]), bf16 dst
// (mapped pinned host memory), rounded stochastically so that many small contributions are not lost.
// The random bits are a function of (seed, index_base + i, the value rounded): deterministic and
// independent of how often the model has run (a resumed run rounds exactly like an uninterrupted one).
// n a multiple of 4, dst 8-byte and src 16-byte aligned.
void accumulate_bf16(void* dst, const float* src, int64_t n, bool overwrite, uint64_t index_base, uint32_t seed,
                     cudaStream_t s);
// accumulate_bf16 with `overwrite` read on the device from *overwrite (nonzero: overwrite), for CUDA graphs.
void accumulate_bf16_or_overwrite(void* dst, const float* src, int64_t n, const int32_t* overwrite, uint64_t index_base,
                                  uint32_t seed, cudaStream_t s);

// ---- lora_dropout.cu ----
// LoRA dropout (core/lora_dropout.h's mask of (seed, *pass, slot) over the n elements): out = x * mask
// (the adapter's dropped input), and dx += mask * g (its input gradient through the same mask). The
// pass count is read on the device, so a captured CUDA graph draws each pass's masks.
void lora_dropout_forward(DType act, void* out, const void* x, int64_t n, uint64_t seed, const uint64_t* pass,
                          uint64_t slot, float p, cudaStream_t s);
void lora_dropout_backward_add(DType act, void* dx, const void* g, int64_t n, uint64_t seed, const uint64_t* pass,
                               uint64_t slot, float p, cudaStream_t s);
// *pass += step (a training pass has ended; step: the number of data-parallel ranks, whose passes
// interleave in the global order of the micro-batches, CpuLora::end_pass).
void lora_count_pass(uint64_t* pass, uint64_t step, cudaStream_t s);

// ---- fused FP8 codes (lora_dy_grads.cu, lora_u_codes.cu) ----
// The FP8 codes a kernel writes of a tensor it reads for its own product, as quantize_fp8 writes them (the
// same bytes), so the FP8 GEMM that reads them needs no quantize pass of its own: codes [N, cols] with row
// stride ldc (8-byte aligned, ldc a multiple of 8: fp8_codes_out_supported), the scale from *amax (the
// tensor's device abs-max, already found: of a tensor the read one may be a column slice of), 1/scale to
// *inv_out (when not null).
struct Fp8CodesOut {
    void* codes = nullptr;
    int64_t ldc = 0;
    DType type = DType::E5M2;  // E4M3 or E5M2
    const float* amax = nullptr;
    float* inv_out = nullptr;
};
bool fp8_codes_out_supported(const Fp8CodesOut& codes);

// ---- lora_dy_grads.cu ----
// LoRA's two products of one target's output gradient in one read of it (the two GEMMs read it twice):
//   g[N, r]    (bf16, row stride ldg)  = scale * dy[N, out] B[out, r]
//   dB[out, r] (fp32, row stride r)   += scale * dy^T u[N, r]
// dy and u bf16 with row strides ldy and ldu; B [out, r] contiguous bf16. lora_dy_grads_supported
// says whether this kernel takes the call (bf16, r a multiple of 8 up to 32, out, ldy and ldu multiples
// of 8, dy and u 16-byte aligned); otherwise the GEMMs do. The plan fixes the grid (from the SM count)
// and the fp32 workspace the partial sums need (workspace_bytes, 256-byte aligned). Deterministic.
// codes (optional): dy's FP8 codes in the same read (lever 7). Not yet used by the model on main: its GPU
// test and bench/lora_fused_bench run first (perf-notes session 27).
struct LoraDyGradsPlan {
    int64_t N = 0, out = 0;
    int r = 0;
    int col_strips = 0, token_strips = 0;
    int64_t n_pad = 0, out_pad = 0;
    std::size_t workspace_bytes = 0;
};
bool lora_dy_grads_supported(DType act, const void* dy, int64_t ldy, const void* u, int64_t ldu, int64_t out, int r);
// (sm_count is taken as at most kLoraDyGradsMaxSms, so a memory plan made without the device can hold
// the workspace of any: lora_dy_grads_workspace_bound)
constexpr int kLoraDyGradsMaxSms = 160;
LoraDyGradsPlan plan_lora_dy_grads(int64_t N, int64_t out, int r, int sm_count);
std::size_t lora_dy_grads_workspace_bound(int64_t N, int64_t out, int r);
void lora_dy_grads(const LoraDyGradsPlan& plan, void* g, int64_t ldg, float* dB, const void* dy, int64_t ldy,
                   const void* B, const void* u, int64_t ldu, float scale, void* workspace, cudaStream_t s,
                   const Fp8CodesOut* codes = nullptr);

// ---- lora_u_codes.cu ----
// LoRA's first product of a matrix's input and that input's FP8 codes in one read of x (lever 8; the u
// GEMM and quantize_fp8 read it once each):
//   u[N, W] (bf16, row stride ldu) = x[N, in] A[W, in]^T      (A: the matrix's stacked A's, W = G r)
//   codes[N, in] = fp8(x * scale)                                (as quantize_fp8; codes.ldc = in)
// x and A contiguous bf16. lora_u_codes_supported: bf16, in and W multiples of 8, W <= 96, x and A
// 16-byte aligned, codes as fp8_codes_out_supported. Not yet used by the model on main.
bool lora_u_codes_supported(DType act, const void* x, int64_t in, const void* A, int W, const Fp8CodesOut& codes);
void lora_u_codes(void* u, int64_t ldu, const void* x, int64_t N, int64_t in, const void* A, int W,
                  const Fp8CodesOut& codes, cudaStream_t s);

}  // namespace qtrain::cuda
