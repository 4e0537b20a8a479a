// Everything a model backend needs to know about how to train: shapes of the micro-batch, the
// precision of each role, recompute, offload and sharding. Filled from TrainOptions by the engine
// (TrainOptions::model_options: each flag's entry of the option table, src/train/option_table.cpp,
// fills the fields it decides, with its implications applied); the model layer knows nothing of the
// training loop.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "model/lora.h"

namespace qtrain {

// Attention kernels of the GPU model (--attention): Auto = cuDNN where this build and machine have it
// and the model is bf16, else qtrain's flash kernels.
enum class AttentionImpl { Auto, Flash, Cudnn };

// Which FP8 GEMMs use cuBLASLt's fast accumulation (--fp8-fast-accum): the tensor cores' partial sums
// are not promoted to full fp32 every few k-blocks. Faster (up to ~20% on narrow GEMMs), slightly
// less accurate. Forward = the forward products only (as TransformerEngine does by default).
enum class Fp8FastAccum { Off, Forward, All };

struct ModelOptions {
    int batch_size = 4;   // micro-batch rows
    int seq_len = 1024;

    // precision per role (docs/design.md, "Precision")
    DType model_dtype = DType::BF16;      // weights and activations
    DType matmul_dtype = DType::BF16;     // matmul inputs
    DType gradient_dtype = DType::BF16;   // activation gradients into matmuls
    DType opt_m_dtype = DType::F32;
    DType opt_v_dtype = DType::F32;
    DType master_dtype = DType::F32;
    DType param_grad_dtype = DType::F32;  // the accumulated parameter gradients (bf16: staged, gradients.h)
    // --lm-head-dtype=e4m3 (needs matmul_dtype e4m3): the LM head's GEMMs in FP8 too (its logits GEMM
    // always; dx and dW only with FP8 gradients). Off: the head stays in the model dtype, as before.
    bool fp8_lm_head = false;

    // recompute
    bool recompute_swiglu = false, recompute_norm = false, recompute_qkv = false;
    bool recompute_ffn = false, recompute_att = false, recompute_block = false;
    // offload to pinned host memory
    bool offload_residual = false, offload_master = false, offload_opt_m = false, offload_opt_v = false;
    bool offload_quants = false, offload_gradients = false;
    bool persistent_quants = false, write_combined = false, memcpy_all_gather = false;
    // the optimizer stages offloaded state through two device chunks on copy engines instead of
    // reading it zero-copy; chunk size in elements (a multiple of 64; tests make it small)
    bool offload_double_buffer = false;
    int64_t optimizer_chunk = int64_t{1} << 24;
    // Sharding, the one encoding of the ZeRO level (zero_level below; --zero-level=2|3 reach the model as
    // these): with several ranks shard_gradients is ZeRO-2 and shard_weights ZeRO-3 (which shards the
    // gradients too); on one GPU they stream the weights, and the gradients per layer, from host memory.
    bool shard_weights = false, shard_gradients = false;
    int gpus = 1;         // ranks of the data-parallel run (the trainer resolves mpirun's -np into it; the GPU plan's block sizes)
    // The CUDA device of this rank (the GPU model makes it current with cudaSetDevice): set by the
    // trainer per rank from --gpu-ids, by default rank r -> device r in threads mode and the process's
    // local rank under mpirun. The CPU model has no device and ignores it.
    int device_index = 0;

    bool use_cuda_graphs = false;
    // Packed rows of several documents (--document-masking): batches carry Batch::positions, attention
    // is block-causal per document and RoPE restarts at each document.
    bool document_masking = false;
    int lmhead_chunks = 1;
    int attn_bwd_chunks = 1;
    AttentionImpl attention = AttentionImpl::Auto;
    // cuDNN attention with document masking: document slots per row of its ragged batch
    // (cuda/attention_ragged.h); a row with more documents is refused. Unused otherwise.
    int max_docs_per_row = 32;
    Fp8FastAccum fp8_fast_accum = Fp8FastAccum::Off;
    // --fp8-weight-transposes=jit (needs matmul_dtype e4m3 and an FP8 gradient_dtype): the full model
    // keeps only the row-major e4m3 copy of each layer matrix (W); the backward transposes each one
    // into one scratch buffer just before its input-gradient GEMM, instead of keeping Wᵀ for the
    // whole step (fp8_transposes_just_in_time, model/cuda/gpu_buffers.h). Bit-identical; a memory
    // setting. (LoRA's FP8 base always does this.)
    bool fp8_transposes_jit = false;
    bool gemm_autotune = false;  // time cuBLASLt's candidate algorithms per shape (cuda/gemm.h)
    uint64_t memory_limit = 0;  // bytes; 0 = the device's free memory
    // LoRA adapters on a frozen base (--lora-*; model/lora.h); rank 0 = full training
    LoraOptions lora;
    // Test-only (no flag sets it): LoRA's FP8 base without bf16 matrices (fp8_base_only,
    // model/cuda/gpu_buffers.h) keeps every layer matrix's transposed e4m3 copy for the whole run, as
    // it did before the backward transposed each matrix just in time into one scratch buffer, so a
    // GPU test can run both and compare them bit for bit (tests/gpu/cuda_lora_fp8_transpose_test.cpp).
    bool fp8_base_keep_transposed = false;

    bool operator==(const ModelOptions&) const = default;
};

// ZeRO with several ranks: what each rank keeps 1/N of (the optimizer state; + the gradients; + the
// weights). The number is the level (--zero-level, IModel::set_communicator, "ZeRO-N").
enum class ZeroLevel { Optimizer = 1, Gradients = 2, Weights = 3 };

// The level the sharding of `o` is with several ranks.
inline ZeroLevel zero_level(const ModelOptions& o) {
    return o.shard_weights ? ZeroLevel::Weights : o.shard_gradients ? ZeroLevel::Gradients : ZeroLevel::Optimizer;
}

// Whether --fp8-weight-transposes chooses anything: the full model with FP8 matmuls and FP8 gradients
// keeps transposed e4m3 weight copies unless it says jit (a bf16 backward reads the bf16 weights; LoRA's
// FP8 base transposes just in time whatever it says). The GPU model's layout (gpu_buffers.cpp) and the
// memory ladder (train/memory_fit.cpp) both ask this one question.
inline bool fp8_weight_transposes_apply(const ModelOptions& o) {
    return is_fp8(o.matmul_dtype) && is_fp8(o.gradient_dtype) && !o.lora.enabled();
}

}  // namespace qtrain
