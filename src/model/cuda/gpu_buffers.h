// Every device buffer of the GPU model, bound in one function used twice: once with no memory to
// measure (the plan, --plan-only, needs no GPU), once over the real allocations. So the plan and
// what is allocated cannot drift apart: one cudaMalloc per category, sub-allocated here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/cuda/gpu_layout.h"
#include "model/cuda/lora_layout.h"
#include "model/cuda/param_shard.h"
#include "model/memory_plan.h"
#include "model/model_config.h"
#include "model/model_options.h"

namespace qtrain {

// A category of memory (one allocation) carved into aligned pieces.
struct Arena {
    std::string category;
    bool pinned_host = false;
    char* base = nullptr;  // null while measuring
    std::size_t used = 0;
    std::size_t allocated = 0;  // bytes at base (what the constructor allocated)
    bool registered = false;    // pinned by cudaHostRegister of an mmap (cuda/pinned_memory.h)

    void* take(std::size_t bytes) {
        used = (used + 255) / 256 * 256;
        void* p = base ? base + used : nullptr;
        used += bytes;
        return p;
    }
    template <class T>
    T* take_n(std::size_t count) { return static_cast<T*>(take(count * sizeof(T))); }
    void* take_typed(std::size_t count, DType t) { return take(count * dtype_size(t)); }
};

// Which saved activations the backward recomputes instead of keeping one copy per layer (the
// --recompute-* flags with their implications: ffn -> swiglu, att -> qkv, block -> everything but
// the layer's input residual). A recomputed activation has one buffer shared by all layers.
struct RecomputeSet {
    bool ln1 = false, ln2 = false;  // RMSNorm outputs (--recompute-norm)
    bool qkv = false;               // QKV projection + bias + RoPE
    bool att = false;               // attention output and its log-sum-exp
    bool res_mid = false;           // residual after the attention block (block only)
    bool gate_up = false;           // gate|up projection
    bool swi = false;               // SwiGLU output
    bool any() const { return ln1 || ln2 || qkv || att || res_mid || gate_up || swi; }
};
RecomputeSet recompute_set(const ModelOptions& opt);

// FP8 scale slots (each float in its own 16-byte slot: cuBLASLt wants aligned scale pointers).
// Per layer and matrix m (0 qkv, 1 o, 2 gate_up, 3 down): the weight's amax and inverse scale and the
// forward input activation's amax and inverse scale; then one amax / inverse-scale pair for the
// gradient being quantised (used one GEMM at a time).
// (The weight amax lives in GpuBuffers::weight_amax instead, contiguous for AdamW; its slots here
// are unused.)
enum class Fp8Slot { WeightAmax = 0, WeightInv = 4, ActAmax = 8, ActInv = 12 };
constexpr int kFp8SlotsPerLayer = 16;
inline int fp8_slot(int layer, Fp8Slot kind, int matrix) { return layer * kFp8SlotsPerLayer + static_cast<int>(kind) + matrix; }
inline int fp8_grad_amax_slot(int layers) { return layers * kFp8SlotsPerLayer; }
inline int fp8_grad_inv_slot(int layers) { return layers * kFp8SlotsPerLayer + 1; }
// --lm-head-dtype=e4m3: the LM head's own slots after the gradient pair (only allocated with it): the
// final norm output's amax and inverse scale, the head weight's, and d(logits)'s (each LM-head chunk
// quantised with its own, one chunk at a time).
enum class Fp8HeadSlot { XAmax = 0, XInv = 1, WAmax = 2, WInv = 3, GradAmax = 4, GradInv = 5 };
constexpr int kFp8HeadSlots = 6;
inline int fp8_head_slot(int layers, Fp8HeadSlot s) { return layers * kFp8SlotsPerLayer + 2 + static_cast<int>(s); }

struct GpuLayerActivations {
    void *res_in, *ln1, *qkv, *att, *res_mid, *ln2, *gate_up, *swi;
    float *rstd1, *rstd2, *lse;
    // Qwen3's q/k norm (null without one): the pre-norm q|k [N, (Hq+Hkv)*D] and their rstd [N, Hq+Hkv],
    // written by the fused q/k norm + RoPE forward for its backward (shared when qkv is recomputed)
    void* qk_pre = nullptr;
    float* qk_rstd = nullptr;
    // FP8 with FP8 gradients: the input of matrix m (ln1, att, ln2, swi) quantised and transposed
    // ([in, N], one byte per element), written by the training forward for the weight-gradient
    // GEMM, so the backward need not re-quantise it; null where that input is recomputed (the
    // backward quantises the recomputed one) or without FP8 gradients.
    void* xT[4] = {nullptr, nullptr, nullptr, nullptr};
};

// The optimizer-state role's memory (optimizer_state.h): Adam's moments over the flat parameter
// space, the weight-decay segment table, and the double-buffered optimizer's staging chunks: for each
// flat array AdamW touches that lives in pinned host memory (kOptMaster .. kOptWeights), two device
// chunks of `chunk` elements that the copy engines fill and drain while AdamW works on the other
// (null: not staged; --offload-double-buffer).
struct OptimizerBuffers {
    void* adam_m = nullptr;
    void* adam_v = nullptr;
    void* segments = nullptr;  // ParamSegment table
    int num_segments = 0;
    void* stage[5][2] = {};
    int64_t chunk = 0;
    int64_t elements = 0;  // of adam_m / adam_v: the whole flat space, or a data-parallel rank's block
};

// LoRA (--lora-rank, lora_layout.h): the adapters' state over their flat space (master, gradient and
// Adam's moments in fp32; `weights`, the model-dtype copy the GEMMs read, is the master itself in an
// fp32 model), the activations the backward reads (x A^T of every adapter, `saved`, [slots, N, r] in
// the model dtype), the scratch of one adapter at a time (d(x A^T) [N, r]; with dropout the dropped
// input and its gradient, [N, widest input]) and the device count of training passes the dropout
// masks are drawn from. All null without LoRA.
struct LoraBuffers {
    float* master = nullptr;
    float* grads = nullptr;
    void* weights = nullptr;
    OptimizerBuffers opt;
    void* saved = nullptr;
    void* dh = nullptr;
    void* xd = nullptr;
    void* dxd = nullptr;
    uint64_t* pass = nullptr;
};

struct GpuBuffers {
    // parameters (layout: GpuParamLayout)
    void* weights = nullptr;  // act dtype; == master in fp32 mode
    float* master = nullptr;
    void* grads = nullptr;  // fp32, or bf16 with --param-grad-dtype=bf16 (then in pinned host memory)
    OptimizerBuffers opt;   // handed to the optimizer-state role
    // saved activations
    std::vector<GpuLayerActivations> layers;
    void* res_final = nullptr;  // residual after the last layer
    void* xf = nullptr;         // final norm output
    float* rstd_final = nullptr;
    // backward and scratch
    void *tmp_h, *d_res, *d_ln, *d_qkv, *d_att, *d_swi, *d_gu, *logits;
    float *losses, *col_scratch, *norm_partials, *norm_out, *loss_acc, *cos_sin;
    // data parallel: every rank's loss (gathered), and norm_partials holds every rank's partial sums
    // of squares (norm_partials_count() per rank, in rank order)
    float* rank_losses = nullptr;
    void* attn_workspace = nullptr;
    int32_t *inputs, *targets, *emb_unique, *emb_offsets, *emb_positions;
    // --document-masking: the micro-batch's Batch::positions [B*T] (RoPE position of each token, restarting
    // at each document), read by RoPE and attention; one fixed buffer refreshed by upload_batch, so a
    // captured CUDA graph reads each micro-batch's. Null without document masking (plain causal).
    int32_t* doc_positions = nullptr;
    // pinned host staging for the per-micro-batch uploads
    // inputs | targets | unique | offsets | emb positions | scalars (4) | doc positions (document masking)
    int32_t* host_staging = nullptr;
    // per-micro-batch scalars on the device, read by the kernels (so a CUDA graph can replay the
    // step): [0] loss scale, [1] gradient scale of the logits (floats), [2] distinct tokens (int32);
    // [3] (int32, --offload-gradients under CUDA graphs) nonzero while the host gradient holds nothing
    // of this step: the captured flushes copy instead of adding (gradients.h)
    float* step_scalars = nullptr;

    // FP8 (--matmul-dtype=e4m3): quantised weights at the flat parameter offsets (1 byte per
    // element; wTq transposed, only with fp8 gradients), per-tensor scale slots (fp8_slot()), and
    // workspaces for one quantised activation (xq, its transpose xTq) and one quantised gradient
    // (dyq, its transpose dyTq) at a time.
    void *wq = nullptr, *wTq = nullptr;
    float* fp8_scales = nullptr;
    float* weight_amax = nullptr;  // 4 slots per layer (16 bytes each), contiguous: AdamW fills them
    void *xq = nullptr, *xTq = nullptr, *dyq = nullptr, *dyTq = nullptr;
    // --lm-head-dtype=e4m3: with FP8 gradients, one LM-head chunk's d(logits) quantised ([rows, V]) and
    // transposed ([V, rows]); with streamed weights (--shard-weights) or LoRA's FP8 base without bf16
    // matrices (fp8_base_only), the head's FP8 copies ([V, h] and, with FP8 gradients, [h, V]; other
    // resident weights keep them in wq / wTq at the head's flat offset).
    // The final norm's output is quantised into xq (and a chunk of it, transposed, into xTq).
    void *lm_dyq = nullptr, *lm_dyTq = nullptr;
    void *lm_wq = nullptr, *lm_wTq = nullptr;
    // LoRA's FP8 base without bf16 matrices (fp8_base_transposes_in_backward), or the full model with
    // --fp8-weight-transposes=jit (fp8_transposes_just_in_time): no wTq; the backward's input-gradient
    // GEMM reads one matrix's transposed codes at a time from here ([in, out], the largest layer
    // matrix's bytes), which Weights::transposed writes from wq (or a streamed slot) just before it.
    // Streamed (fp8_base_streamed): wq is in pinned host memory (ZeRO-3: the rank's block of it on the
    // device, fp8_base_block) and the layers' codes pass through quant_slots (one layer span each, layer
    // l in slot l % 2).
    void* wT_scratch = nullptr;

    // Weight streaming (--shard-weights on one GPU): `weights` is the whole flat copy in pinned host
    // memory (under ZeRO-3 the rank's block, weights_sharded_over_ranks, and the embedding is always
    // resident); the device keeps the embedding, final norm and LM head (resident_weights: the elements
    // before layout.layer_begin(0), then those from layout.layers_end()) and two layer slots the
    // layers pass through (layer l uses slot l % 2), with their FP8 copies in quant_slots. Untied
    // models (embedding_weights_on_host) leave the embedding out: its lookup reads the micro-batch's
    // rows from the pinned host weights, and resident_weights starts at layers_end().
    void* resident_weights = nullptr;
    void* weight_slots[2] = {nullptr, nullptr};
    void* quant_slots[2] = {nullptr, nullptr};
    void* quantT_slots[2] = {nullptr, nullptr};
    // --persistent-quants with streamed FP8 layers: every layer's row-major FP8 copy (layer l at
    // l * layer_span bytes, the layer's offsets), written the first time the layer is quantised after
    // an optimizer step and copied into quant_slots for every later pass; on the device, or in pinned
    // host memory with --offload-quants.
    void* quant_store = nullptr;
    // ZeRO-3 with FP8 weights and FP8 gradients (fp8_weights_gathered): the rank's block quantised
    // (1 byte per element, the block's offsets; only its matrices' elements are meaningful) with
    // each matrix's whole-tensor scale, and every rank's abs-max of its part of each matrix
    // ([world][4 * layers] floats), from which that scale comes.
    void* quant_block = nullptr;
    float* rank_amax = nullptr;
    // Gradient streaming (--offload-gradients): `grads` is in pinned host memory; the device keeps
    // the non-layer gradients (resident_grads, same split as resident_weights) and two layer slots
    // each layer's backward writes into before a side stream adds them to the host copy. Untied
    // models (embedding_grad_on_host) leave the embedding out of resident_grads: its backward adds the
    // micro-batch's rows into the host copy directly, so resident_grads starts at layers_end().
    float* resident_grads = nullptr;
    float* grad_slots[2] = {nullptr, nullptr};
    // ZeRO-2 with the gradients reduced per layer (gradients_reduced_per_layer): `grads` is the rank's
    // block only; resident_grads and grad_slots as for --offload-gradients, on the device; and one
    // layer span the reductions to each range's owner land in before they are added to the block.
    float* grad_reduce_tmp = nullptr;
    // Residual offload (--offload-residual): each layer's input residual (res_in, the one activation
    // --recompute-block keeps per layer) is copied to pinned host memory (res_host, layer l at
    // l * N * hidden) as soon as it is written; on the device the layers share two slots (layer l
    // uses res_slots[l % 2], which layers[l].res_in points to) and the backward loads them back.
    void* res_host = nullptr;
    void* res_slots[2] = {nullptr, nullptr};

    // LoRA: the frozen base has no gradient, master or moments (grads and master null, the moments
    // empty); --train-also's tensors have theirs with the adapters' (lora_layout.h).
    LoraBuffers lora;

    int lmhead_chunk_rows = 0;
    std::size_t attn_workspace_bytes = 0;
};

// The flat arrays of the optimizer, in OptimizerBuffers::stage order.
enum OptArray { kOptMaster = 0, kOptGrads = 1, kOptM = 2, kOptV = 3, kOptWeights = 4 };
// Whether array a lives in pinned host memory under these options (so the double-buffered optimizer
// stages it).
bool optimizer_array_on_host(const ModelOptions& opt, OptArray a);
// Whether streamed FP8 layers keep their quantised copies for the whole optimizer step
// (--persistent-quants or --offload-quants with --shard-weights and --matmul-dtype=e4m3).
bool streamed_quants_persist(const ModelOptions& opt);
// Whether the embedding's gradient is summed straight into its pinned host copy (untied models
// with --offload-gradients): resident_grads then holds only the final norm and the LM head.
bool embedding_grad_on_host(const ModelConfig& cfg, const ModelOptions& opt);
// ZeRO-2 on the GPU (--gpus > 1 with --zero-level=2 / --shard-gradients): each layer's gradient is
// reduced to the ranks owning its elements as the backward produces it, and a rank keeps only its
// block of the gradient (plus the non-layer gradients, reduced before the update). Not with
// --use-cuda-graphs (the reductions would be inside the captured backward, which the copy-engine
// communicator cannot be): then the whole gradient is kept and reduce-scattered after the backward.
// Not under LoRA: the frozen base has no gradient (ZeRO-2 of the adapters reduce-scatters theirs after
// the backward, lora_adapters.h).
bool gradients_reduced_per_layer(const ModelOptions& opt);
// Whether each layer's backward accumulates its gradient into a zeroed fp32 device slot that the
// gradients role's stream then adds into the flat gradient kept for the step (gradients.h, "streamed"):
// with --offload-gradients (the flat copy in pinned host memory), ZeRO-2's per-layer reductions (the
// rank's block), and bf16 gradients (--param-grad-dtype=bf16; on the device too: each micro-batch's
// layer sum is rounded into the bf16 copy once, stochastically, as the host path does). Never for
// LoRA's frozen base.
bool gradients_staged(const ModelOptions& opt);
// Whether the embedding lookup reads its rows from the pinned host weights (untied models with
// --shard-weights on one GPU): resident_weights then holds only the final norm and the LM head.
bool embedding_weights_on_host(const ModelConfig& cfg, const ModelOptions& opt);
// ZeRO-3 (--shard-weights with --gpus > 1): `weights` is the rank's block of the flat model-dtype
// weights only; every rank keeps the non-layer weights whole in resident_weights (refreshed from
// their owners after each update) and gathers each layer from its owners into the weight slots.
bool weights_sharded_over_ranks(const ModelOptions& opt);
// Whether `weights` (the whole flat copy, or under ZeRO-3 the rank's block) is in pinned host
// memory: --shard-weights on one GPU (streaming), or ZeRO-3 with --offload-master (the rank
// streams its block from host memory).
bool weights_on_host(const ModelOptions& opt);
// ZeRO-3 with --matmul-dtype=e4m3 and FP8 gradients: each rank quantises its block of the layer
// matrices once per step with the whole matrices' scales, and the layers are gathered as FP8 bytes
// (half the traffic of bf16; the backward needs no bf16 matrix with FP8 gradients). The full model's:
// LoRA's FP8 base gathers the codes its load made once (fp8_base_streamed).
bool fp8_weights_gathered(const ModelOptions& opt);
// LoRA on an FP8 base with FP8 gradients (--lora-rank, --matmul-dtype=e4m3, --gradient-dtype=e4m3|e5m2):
// no GEMM reads the base's bf16 matrices (the forward and the input gradient read the e4m3 copies; a
// frozen base has no dW), so the device keeps only those copies: `weights` holds the norms, biases,
// embedding and LM head (GpuParamLayout::compact_index), and the load quantises each matrix from a
// staging buffer; wq spans the layers only (element layer_begin(0) first) and their transposes are made
// one matrix at a time by the backward (fp8_base_transposes_in_backward, below); the FP8 head has its
// own copies (lm_wq / lm_wTq). With bf16 gradients the input-gradient GEMM reads the bf16 matrices,
// which stay.
bool fp8_base_only(const ModelOptions& opt);
// The FP8 base keeps only the row-major e4m3 copies (wq): the input-gradient GEMM, which needs W^T
// K-major (Hopper's FP8 GEMMs take both operands K-major), reads each matrix transposed just in time
// into one scratch buffer the size of the largest layer matrix (wT_scratch, its own category
// "Transpose scratch"), instead of a second copy of every matrix (half the e4m3 bytes: 6.1 GiB for
// Qwen2.5-7B). A transpose moves the bytes as they are, so the GEMM reads the same operand as the
// kept copy. fp8_base_only unless the test-only ModelOptions::fp8_base_keep_transposed is set.
bool fp8_base_transposes_in_backward(const ModelOptions& opt);
// Whether the input-gradient GEMMs read Wᵀ transposed just in time into wT_scratch ("Transpose
// scratch", the largest layer matrix's bytes) rather than from kept copies: LoRA's FP8 base
// (fp8_base_transposes_in_backward), or the full model with --fp8-weight-transposes=jit
// (ModelOptions::fp8_transposes_jit) and FP8 gradients. The full model then keeps no wTq (resident:
// one byte per flat parameter less; streamed or ZeRO-3: no quantT_slots), an FP8 LM head gets its own
// transposed copy (lm_wTq), and the weights role quantises W only (quantize_fp8: the codes
// quantize_fp8_transpose writes row-major, bit for bit).
bool fp8_transposes_just_in_time(const ModelOptions& opt);
// The FP8 base streamed from host memory (--shard-weights under LoRA, one GPU; fp8_base_only): wq, the
// layers' e4m3 codes, is in pinned host memory ("Streamed base", loaded there once by the load); the
// layers pass through two device slots of one layer span each (quant_slots, "Weight slots"), copied in
// by the weights role's copy stream one layer ahead of the compute (weights.h), and transposed just in
// time from there. The norms, biases, embedding, LM head (and its FP8 copies) and every scale stay
// resident; nothing is quantised as it arrives (the codes are the load's), so the GEMMs read the bytes
// the resident base holds. (--shard-weights under LoRA with bf16 gradients streams the bf16 base as
// the full model streams its weights: weights_on_host.)
// ZeRO-3 under LoRA (--shard-weights with --gpus > 1) uses the same slots, but wq is on the device and
// holds only the rank's block of the layers' codes (fp8_base_block); each layer's codes are gathered
// from their owners into its slot (weights.h). The load sees every whole matrix on every rank, so each
// rank quantises it with the whole matrix's scale and keeps its part: the gathered codes are the
// unsharded base's, bit for bit.
bool fp8_base_streamed(const ModelOptions& opt);
// The FP8 base's block of rank `rank` under ZeRO-3: param_shard over the layers' span of codes (one byte
// per element from layout.layer_begin(0) to layout.layers_end(); the non-layer tensors are resident in
// `weights` on every rank and have no codes), so each rank keeps 1/N of the codes.
ParamShard fp8_base_block(const GpuParamLayout& layout, int world, int rank);

// Binds every buffer into the arenas (Weights, Master, Gradients, Adam M, Adam V, Activations,
// Workspace, Host staging, Quants, Weight slots, Gradient slots, Residuals, Optimizer staging,
// Persistent quants, LoRA adapters, LoRA activations, Transpose scratch, Streamed base). With null arena bases it
// only measures.
void bind_gpu_buffers(GpuBuffers& b, std::vector<Arena>& arenas, const ModelConfig& cfg, const ModelOptions& opt,
                      const GpuParamLayout& layout);
std::vector<Arena> make_arenas(const ModelOptions& opt);

// cuBLASLt workspace (allocated by GemmRunner, counted in the plan).
constexpr std::size_t kGemmWorkspaceBytes = 64ull << 20;

MemoryPlan gpu_memory_plan(const ModelConfig& cfg, const ModelOptions& opt, const std::string& device_name);

}  // namespace qtrain
