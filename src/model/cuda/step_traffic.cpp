#include "model/cuda/step_traffic.h"

#include <map>

#include "core/dtype.h"
#include "model/cuda/attention_choice.h"
#include "model/cuda/gpu_buffers.h"
#include "model/cuda/gpu_layout.h"

namespace qtrain {

std::vector<StepTraffic> step_traffic(const ModelConfig& c, const ModelOptions& o) {
    const double N = static_cast<double>(o.batch_size) * o.seq_len, L = c.num_hidden_layers;
    const double h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), qkvd = q + 2 * kv, I = c.intermediate_size,
                 V = c.vocab_size;
    const double A = static_cast<double>(dtype_size(o.model_dtype));
    const bool fp8 = o.matmul_dtype == DType::E4M3, fp8g = fp8 && is_fp8(o.gradient_dtype);
    const bool frozen = o.lora.enabled();
    // the full model with FP8 gradients also writes each quantised GEMM input (and dy) transposed, for dW
    const double t = fp8g && !frozen ? 1.0 : 0.0;
    std::map<std::string, double> per_token;  // bytes per token of the micro-batch, by family
    auto add = [&](const char* name, double bytes) { per_token[name] += bytes; };

    // ---- forward, per layer ----
    add("rmsnorm fwd", L * 2 * 4 * h * A);  // each norm: the residual and the added output in, both out
    const double rope = (q + kv) * A * (c.qk_norm ? 3 : 2);  // q|k in place (Qwen3: + the saved pre-norm q|k)
    add("rope", L * rope);
    add("swiglu", L * 3 * I * A);  // gate|up in, swi out
    if (fp8) {
        // each matrix's input: read, its e4m3 codes written (and transposed for dW); the attention output's
        // amax is a pass of its own on cuDNN (fused into the flash kernels' epilogue)
        add("fp8 quantize", L * (2 * h + q + I) * (A + 1 + t));
        if (choose_attention_backend(c, o) == AttentionBackend::Cudnn) add("fp8 quantize", L * q * A);
    }
    add("rmsnorm fwd", 4 * h * A);  // the final norm
    add("embedding", 2 * h * A);    // a row read, the residual written
    // ---- the LM head's elementwise part, per token ----
    add("cross entropy", 2 * V * A);  // the logits read, their gradient written in place
    if (o.fp8_lm_head) {
        add("fp8 quantize", (2 * A + 1) * h);  // the final norm's output: amax, then codes
        if (fp8g) add("fp8 quantize", (2 * A + 1 + t) * V);  // d(logits): amax, codes (and transposed)
    }
    // ---- backward, per layer ----
    add("rmsnorm bwd", L * 2 * 4 * h * A);  // each: dy, its input and the residual gradient in, that out
    add("rope", L * rope);  // d(q|k) in place (Qwen3: + the saved pre-norm q|k read)
    // SwiGLU's backward: d_swi and gate|up in; d(gate|up) out in bf16 where something reads it in bf16
    // (bf16 gradients, LoRA's adapters, MLP biases) and/or as FP8 codes (and transposed)
    const bool dgu_bf16 = !fp8g || frozen || c.mlp_bias;
    add("swiglu", L * (3 * I * A + (dgu_bf16 ? 2 * I * A : 0)));
    // d(gate|up)'s codes need its amax first (current scaling): the SwiGLU backward above finds it, and a
    // second pass writes the codes (CudaModel's Swiglu step), under LoRA from the bf16 d(gate|up) it wrote
    // (2I read), else recomputing it from d_swi and gate|up (3I read; and writing the transposed copy)
    if (fp8g) add("fp8 quantize", L * ((frozen ? 2 : 3) * I * A + 2 * I * (1 + t)));
    if (fp8g) add("fp8 quantize", L * (qkvd + 2 * h) * (A + 1 + t));  // dy of q|k|v, o, down (amax fused)
    if (c.qkv_bias && !frozen) add("bias grad", L * qkvd * A);
    add("rmsnorm bwd", 4 * h * A);  // the final norm
    if (!frozen) add("embedding", (A + 8) * h);  // d(residual) rows into the fp32 gradient rows

    std::vector<StepTraffic> out;
    for (const auto& [name, bytes] : per_token) out.push_back({name, bytes * N, 0.0, false});

    // staged gradients (gradients.h): each layer's fp32 slot read by its flush, which adds it into the kept
    // copy (read and written: in host memory with --offload-gradients, over PCIe), once per micro-batch
    if (gradients_staged(o)) {
        const double layers = static_cast<double>(make_gpu_layout(c).layer_span) * L;
        const double kept = 2 * layers * dtype_size(o.param_grad_dtype);
        out.push_back({"gradient flush", 4 * layers + (o.offload_gradients ? 0 : kept),
                       o.offload_gradients ? kept : 0.0, false});
    }

    // ---- the optimizer, once per step (the full model; LoRA's adapters are small) ----
    if (!frozen) {
        const double P = static_cast<double>(c.num_parameters());
        double dev = 0, host = 0;
        auto place = [&](bool on_host, double bytes) { (on_host ? host : dev) += bytes; };
        place(o.offload_gradients, P * dtype_size(o.param_grad_dtype));  // read
        place(o.offload_opt_m, 2 * P * dtype_size(o.opt_m_dtype));      // read and written
        place(o.offload_opt_v, 2 * P * dtype_size(o.opt_v_dtype));
        const bool weights_on_host = o.shard_weights && o.gpus == 1;
        if (o.model_dtype == DType::F32 || o.master_dtype == DType::BF16) {
            place(weights_on_host, 2 * P * A);  // the weights are the master: read and written
        } else {
            place(o.offload_master, 2 * P * 4);  // the fp32 master read and written
            place(weights_on_host, P * A);       // the weights written
        }
        StepTraffic opt{"optimizer", dev, host, true};
        out.push_back(opt);
        if (fp8 && !weights_on_host)  // the FP8 copies of the updated weights (and their transposes)
            out.push_back({"fp8 quantize (weights, per step)", P * (A + 1 + (fp8g && !o.fp8_transposes_jit ? 1 : 0)),
                           0.0, true});
    }
    return out;
}

}  // namespace qtrain
