// The CPU reference model (--device=cpu): a plain fp32 Qwen2 with forward, backward and AdamW built
// from the ops in cpu_ops.h. It is the oracle for the GPU model, lets CI run the whole training
// engine without a GPU, and trains small demo models on a laptop.
//
// Storage: all parameters live in one flat fp32 buffer in the canonical order of model_parameters(),
// with flat gradient, Adam m and Adam v buffers of the same layout; tensors are found by HF name.
// Activations are kept per layer for the backward and sized for the largest batch seen so far.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/imodel.h"
#include "model/cpu/cpu_lora.h"
#include "model/model_options.h"
#include "model/parameters.h"

namespace qtrain {

namespace cpu {
struct LmHeadFp8;  // cpu_ops.h
}


class CpuModel : public IModel {
public:
    // Throws qtrain::Error naming the flag for any option the CPU model does not implement (it runs
    // every role in fp32, on one device, without recompute, offload, sharding or CUDA graphs).
    CpuModel(const ModelConfig& config, const ModelOptions& options);

    // The same checks as the constructor, without building a model.
    static void check_options(const ModelOptions& options);
    // What a CpuModel of this shape would allocate, without allocating it (--plan-only).
    static MemoryPlan plan(const ModelConfig& config, const ModelOptions& options);
    // ModelOptions with every precision role in fp32: the defaults are GPU-oriented (bf16).
    static ModelOptions fp32_options(int batch_size, int seq_len);

    const ModelConfig& config() const override { return config_; }
    std::string device_name() const override { return "cpu"; }

    void init_random(uint64_t seed) override;
    void load_hf(const std::string& model_dir) override;
    void save_hf(const std::string& dir) const override;

    void forward_backward(const Batch& batch, float grad_scale) override;
    StepStats optimizer_step(const OptimizerParams& params) override;
    void zero_gradients() override;
    float evaluate(const Batch& batch) override;

    void save_checkpoint(const std::string& dir) const override;
    void load_checkpoint(const std::string& dir) override;

    MemoryPlan memory_plan() const override;

    // Data parallel (issue 18): this model is rank comm.rank() of comm.world() replicas, each running
    // forward_backward on its share of the micro-batches (gradients scaled by 1 / (accumulation x
    // world)). optimizer_step then sums the gradients and the loss over the ranks in rank order
    // (ZeRO-1: all-reduce; ZeRO-2: reduce-scatter, each rank keeping its block), computes the global
    // norm from per-rank blocks of the flat parameter space (combined in rank order, so both levels
    // give the same bits), updates its block with AdamW and all-gathers the weights and moments, so
    // every rank holds the whole state (the reference model shards the work, not the memory).
    // ZeRO-3 (`zero_level` 3) keeps the arithmetic of ZeRO-2 (so the bits of ZeRO-1) but changes where
    // the weights live: between steps a rank holds only its block of the weights and moments, each
    // layer (and the embedding, final norm, LM head) is gathered from its owners just before use —
    // in the forward, again in the backward, in evaluate — and released after it (cpu_zero3.cpp).
    // The buffers stay full-size; what a rank does not hold is quiet NaN, so a read of an ungathered
    // weight shows as a NaN loss. Forward passes, save_hf and save_checkpoint are then collective.
    // `zero_level` 1, 2 or 3; null `comm` = a single model again (leaving ZeRO-3 gathers the whole
    // state first, collectively).
    void set_communicator(comm::Communicator* comm, int zero_level) override;
    // (LoRA: the frozen base stays whole on every rank at ZeRO-3 too; cpu_data_parallel.cpp)
    bool weights_sharded() const override { return comm_ != nullptr && zero_level_ == 3 && !frozen_base(); }
    // Under ZeRO-3 the tensor's range is gathered for the read (collective).
    std::vector<float> read_tensor(const std::string& name, TensorKind kind) override;

    // ---- direct access, for tests and for comparing the GPU model against this one ----
    const std::vector<ParamSpec>& params() const { return specs_; }
    // Pointers into the flat buffers; throw naming the tensor if `name` is not a parameter. With LoRA
    // (ModelOptions::lora) the adapters' PEFT names are found too, and the frozen base has no
    // gradient or moments (grad/adam_m/adam_v of a base tensor throw).
    float* param(const std::string& name);
    const float* param(const std::string& name) const { return const_cast<CpuModel*>(this)->param(name); }
    float* grad(const std::string& name);
    float* adam_m(const std::string& name);
    float* adam_v(const std::string& name);
    // The LoRA adapters (empty unless ModelOptions::lora.rank > 0).
    CpuLora& lora() { return lora_; }
    const CpuLora& lora() const { return lora_; }
    // Base weights frozen: LoRA is on. Then save_hf writes the PEFT adapter (or, with
    // ModelOptions::lora.merge, the merged model) and checkpoints hold the adapters and their moments
    // only (load_checkpoint expects the base loaded already).
    bool frozen_base() const { return lora_.enabled(); }
    int64_t num_elements() const { return static_cast<int64_t>(params_.size()); }
    // The flat elements [begin, end) this rank owns under data parallel (its block of ceil(P / W));
    // [0, P) for a single model. Under ZeRO-3 only these hold weights and moments between steps.
    std::pair<int64_t, int64_t> owned_range() const;
    // Step loss accumulated since the last optimizer_step.
    double step_loss() const { return step_loss_; }
    // Mean loss like evaluate(), with the per-token losses averaged in double (no final rounding to
    // float): finite-difference tests need the extra digits.
    double evaluate_f64(const Batch& batch);
    // Activation floats for a B x T micro-batch (what memory_plan() reports, in elements).
    static int64_t activation_floats(const ModelConfig& cfg, int B, int T, int lmhead_chunks, bool backward);

private:
    // Pointers to one decoder layer's tensors inside a flat buffer (parameters or gradients).
    // A tensor the block does not have (a bias, the q/k norms: the model's optional steps) is null.
    struct Layer {
        float *ln1, *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo, *q_norm, *k_norm, *ln2, *wg, *bg, *wu, *bu, *wd, *bd;
    };
    // Saved activations ([L, ...] per layer) and backward scratch (one layer at a time).
    struct Activations {
        std::vector<float> resid;               // [L+1, N, C] residual stream into each layer, and out
        std::vector<float> resid_mid;           // [L, N, C] after the attention block
        std::vector<float> ln1, ln2;            // [L, N, C]
        std::vector<float> rstd1, rstd2;        // [L, N]
        std::vector<float> q, att;              // [L, N, Hq*D] (q after RoPE)
        std::vector<float> k, v;                // [L, N, Hkv*D] (k after RoPE)
        std::vector<float> q_pre, k_pre;        // q/k norm: q [L, N, Hq*D], k [L, N, Hkv*D] before it
        std::vector<float> q_rstd, k_rstd;      // q/k norm: [L, N*Hq], [L, N*Hkv]
        std::vector<float> lse;                 // [L, B, Hq, T]
        std::vector<float> gate, up, act;       // [L, N, I]
        std::vector<float> final_norm;          // [N, C]
        std::vector<float> rstd_final, losses;  // [N]
        std::vector<float> logits;              // [chunk rows, V]
        std::vector<float> rope_cos, rope_sin;  // [T, D/2]
        int rope_T = 0;
        std::vector<float> tmp, dresid, dln;  // [N, C]
        std::vector<float> dq, datt;          // [N, Hq*D]
        std::vector<float> dk, dv;            // [N, Hkv*D]
        std::vector<float> dgate, dup, dact;  // [N, I]
        // FP8 emulation (--matmul-dtype=e4m3): a fake-quantised GEMM input and gradient
        std::vector<float> fq_x, fq_dy;       // [N, max(C, Q, I)]
    };

    // LoRA --train-also: the adapters' copy of a trained base tensor is the base's own (CpuLora::bind_base);
    // again whenever params_ is replaced.
    void bind_trained_base();
    // The gradients of layer l's norms that --train-also=norms trains (the rest null).
    Layer trained_norm_grads(int l);
    // LoRA: the adapters from the seed (init_lora_parameter), or from --lora-from's PEFT adapter.
    void start_adapters();
    int tensors_per_layer_ = 0;  // model_parameters() per layer (every layer has the same tensors)
    std::vector<int64_t> layer_offsets_;  // per layer, Layer's fields in order: offset or -1 (absent)
    int64_t offset(const std::string& name) const;
    Layer layer(float* base, int l) const;
    void check_batch(const Batch& batch) const;
    void ensure_activations(int B, int T, bool backward);
    // Embedding through the final norm, saving what the backward needs.
    void forward_to_final_norm(const Batch& batch);
    void backward_from_final_norm(const Batch& batch);
    // The LM head matrix (embed_tokens when tied) and its gradient.
    const float* lm_head() const;
    float* lm_head_grad();
    double mean_loss(const Batch& batch) const;
    // FP8 emulation: the GEMM operands rounded through e4m3/e5m2 with the GPU model's per-tensor
    // current scales (core/fp8_reference.h). fq_params_ holds the four matrices of every layer, each
    // fused group (q|k|v, gate|up) sharing one scale as on the GPU.
    bool fp8() const { return options_.matmul_dtype == DType::E4M3; }
    bool fp8_grads() const { return fp8() && is_fp8(options_.gradient_dtype); }
    void quantize_layer(int l);
    // --lm-head-dtype=e4m3 (ModelOptions::fp8_lm_head): the final norm's output (into acts_.fq_x) and
    // the LM head (into fq_params_ at its offset) rounded through e4m3, each with its own per-tensor
    // scale as on the GPU; `fp8` says where they are. Null without an FP8 LM head.
    const cpu::LmHeadFp8* quantize_lm_head(cpu::LmHeadFp8& fp8, int N);
    std::vector<float> fq_params_;

    // ZeRO-3's weight protocol (cpu_zero3.cpp). A Range is a span of the flat parameters used
    // together: the embedding, one layer, the final norm, the LM head (the embedding when tied).
    struct Range {
        int64_t begin, end;
    };
    Range embedding_range() const;
    Range layer_range(int l) const;
    Range norm_range() const;
    Range lm_head_range() const;
    // gather: every owner of a part of `r` broadcasts it (in place: the owner's part is already where
    // it belongs); release: what this rank does not own becomes NaN again (and the layers' FP8
    // copies). Both do nothing unless weights_sharded().
    void gather(Range r);
    void release(Range r);
    // Holds a range gathered for its lifetime.
    struct Held {
        Held(CpuModel& m, Range r) : model(m), range(r) { model.gather(range); }
        ~Held() { model.release(range); }
        Held(const Held&) = delete;
        Held& operator=(const Held&) = delete;
        CpuModel& model;
        Range range;
    };
    // After the state was written whole (init, load) or on entering ZeRO-3: the weights and moments
    // outside this rank's block become NaN.
    void shard_state();
    // `state` whole (weights or a moment): under ZeRO-3 the ranks' blocks all-gathered into `scratch`
    // (collective), else `state` itself.
    const float* whole(const std::vector<float>& state, std::vector<float>& scratch) const;

    ModelConfig config_;
    ModelOptions options_;
    std::vector<ParamSpec> specs_;
    std::vector<int64_t> offsets_;  // element offset of specs_[i] in the flat buffers
    std::unordered_map<std::string, size_t> index_;
    std::vector<float> params_, grads_, adam_m_, adam_v_;
    double step_loss_ = 0.0;
    comm::Communicator* comm_ = nullptr;
    int zero_level_ = 1;
    StepStats data_parallel_step(const OptimizerParams& p);
    StepStats lora_data_parallel_step(const OptimizerParams& p);
    // AdamW over the flat elements [begin, end), gradients read from grads + (i - grads_begin).
    void adamw_range(const OptimizerParams& p, int64_t begin, int64_t end, const float* grads, int64_t grads_begin,
                     float clip_scale);
    Activations acts_;
    CpuLora lora_;
};

}  // namespace qtrain
