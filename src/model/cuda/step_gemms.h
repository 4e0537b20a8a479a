// The GEMMs one training micro-batch of the GPU model makes, as a list: each layer matrix's forward,
// its recompute (from the layer program, so the --recompute-* flags select exactly what the model
// re-runs), input gradient and weight gradient (none for LoRA's frozen base), and the LM head's, in
// the dtypes, accumulation and beta that CudaModel::linear_fwd / linear_bwd and the LM head use.
// bench/step_floor_bench times each on the GPU with cuBLASLt's best algorithm: the measured GEMM floor
// of a command, which issue 32's per-op accounting sets against the op timer's breakdown. LoRA's
// adapters (thin GEMMs, bandwidth-bound) are a list of their own (lora_step_gemms).
//
// CUDA-free (a description; tests/gpu/step_gemms_test.cpp checks it on any machine).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model_config.h"
#include "model/model_options.h"

namespace qtrain {

enum class GemmPass : uint8_t { Forward, Recompute, InputGrad, WeightGrad };

// One GEMM shape and how often a micro-batch runs it. In the row-major terms of cuda/gemm.h: Forward
// and Recompute y[tokens, out] = x[tokens, in] W^T; InputGrad dx[tokens, in] = dy W; WeightGrad
// dW[out, in] (+)= dy^T x (fp32; accumulated with beta 1, or with staged gradients written, beta 0).
struct StepGemm {
    std::string name;  // e.g. "fwd qkv", "dx gate|up", "dw lm head"
    GemmPass pass = GemmPass::Forward;
    int64_t tokens = 0, in = 0, out = 0;
    int calls = 0;          // per micro-batch (layers; LM-head chunks)
    DType dtype = DType::BF16;  // the model dtype: operands of a GEMM that is not FP8, and every output but dW's
    bool fp8 = false;       // FP8 operands (e4m3 x, W; the gradient in --gradient-dtype)
    DType grad_dtype = DType::BF16;  // the FP8 gradient operand's type (InputGrad / WeightGrad in FP8)
    bool fast_accum = false;         // cuBLASLt's FP8 fast accumulation
    bool bias = false;      // Forward / Recompute with the matrix's bias in the epilogue
    float beta = 0.0f;      // 1: accumulates onto its output (dW; LoRA's base onto the adapters' y / dx)
    // LoRA's adapters (lora_step_gemms): thin GEMMs on column slices of wider matrices, as LoraAdapters
    // runs them: the row strides of the [tokens, in] and [tokens, out] operands (0: contiguous, in / out)
    // and the byte alignment the slices allow (GemmOp::min_alignment; 0: 256)
    bool lora = false;
    int64_t ld_in = 0, ld_out = 0;
    int min_alignment = 0;
    double flop() const { return 2.0 * static_cast<double>(tokens) * in * out * calls; }
};

// The list for a micro-batch of o.batch_size x o.seq_len tokens of config c under options o (matrix
// GEMMs in layer order q|k|v, o, gate|up, down; forward, recompute, dx, dW; then the LM head).
std::vector<StepGemm> step_gemms(const ModelConfig& c, const ModelOptions& o);

// LoRA's adapter GEMMs of the same micro-batch (empty without --lora-rank), as LoraAdapters::forward_matrix
// / backward_matrix run them: stacked (one u = x [A..]^T and one dx += g [A..] per fused matrix whose
// targets all have adapters and no dropout) or per target; each target's y (+)= s u B^T, g = s dy B and
// dB += s dy^T u; the forwards again where the layer program recomputes the matrix. Their dW are fp32
// (beta 1). Names "lora fwd u qkv", "lora dx g k", "lora dw A gate|up", ...
std::vector<StepGemm> lora_step_gemms(const ModelConfig& c, const ModelOptions& o);

// Sum of flop() over a list.
double total_flop(const std::vector<StepGemm>& gemms);

const char* gemm_pass_name(GemmPass p);

}  // namespace qtrain
