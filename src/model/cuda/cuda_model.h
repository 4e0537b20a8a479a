// The GPU model (--device=cuda): Qwen2 on one GPU with fp32 master weights, model-dtype (bf16 or
// fp32) weights and activations, cuBLASLt GEMMs and the kernels of src/cuda. It follows the memory
// plan (gpu_buffers.h): everything is allocated once in the constructor, nothing in the step.
// The step never waits for the GPU except where the engine reads the loss and norm back
// (optimizer_step, evaluate).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/op_timer.h"
#include "model/cuda/gpu_buffers.h"
#include "model/cuda/gpu_layout.h"
#include "model/imodel.h"
#include "model/model_options.h"

namespace qtrain {

class GemmRunner;

class CudaModel : public IModel {
public:
    CudaModel(const ModelConfig& config, const ModelOptions& options);
    ~CudaModel() override;

    // Throws naming the flag for options this backend does not implement yet.
    static void check_options(const ModelOptions& options);
    static MemoryPlan plan(const ModelConfig& config, const ModelOptions& options);

    const ModelConfig& config() const override { return config_; }
    std::string device_name() const override { return device_name_; }

    void init_random(uint64_t seed) override;
    void load_hf(const std::string& model_dir) override;
    void save_hf(const std::string& dir) const override;

    void forward_backward(const Batch& batch, float grad_scale) override;
    StepStats optimizer_step(const OptimizerParams& params) override;
    float evaluate(const Batch& batch) override;

    void save_checkpoint(const std::string& dir) const override;
    void load_checkpoint(const std::string& dir) override;

    MemoryPlan memory_plan() const override { return plan_; }

    // ---- for tests: tensors by HF name, as fp32 on the host ----
    enum class Which { Master, Weights, Grad, AdamM, AdamV };
    std::vector<float> download(const std::string& name, Which which) const;
    void upload_master(const std::string& name, const float* data);  // also refreshes the weight copy
    // Forward pass of `batch`; returns the logits [B*T, V] as fp32 (for comparisons with HF).
    std::vector<float> logits(const Batch& batch);
    const GpuParamLayout& layout() const { return layout_; }

private:
    // Copies the batch (and, for training, the embedding-gradient grouping) to the device with the
    // micro-batch's loss and logit-gradient scales.
    void upload_batch(const Batch& batch, bool with_embedding_plan, float loss_scale, float grad_dscale);
    void forward_backward_ops(int B, int T);  // forward, LM head + loss, backward (graph-capturable)
    void forward(int B, int T);
    // LM head + loss over all rows: *loss_acc += loss_scale * sum of row losses; with grads, writes
    // d(loss)/d(xf) into d_ln and accumulates the LM-head weight gradient.
    // The scales come from step_scalars (set by upload_batch).
    void lm_head(int N, float* loss_acc, bool with_grads);
    void backward(int B, int T);
    void recompute_layer(int l, int B, int T);  // the activations the --recompute-* flags dropped
    // The four matrices of a layer, in the order of the FP8 scale slots.
    enum Matrix { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3 };
    int64_t matrix_offset(int l, Matrix m) const;
    // y[N,out] = x[N,in] W^T (+ bias) for matrix m of layer l: bf16 GEMM, or with --matmul-dtype=e4m3
    // x quantised with its current amax (kept per layer for the backward) times the fp8 weight.
    // amax_ready: x's producer already wrote its amax into the layer's activation slot.
    void linear_fwd(int l, Matrix m, void* y, const void* x, const void* bias, int N, int in, int out,
                    bool amax_ready = false);
    // dx = dy W and dW += dy^T x for matrix m of layer l (x: the forward's input activation). With
    // fp8 gradients both run in fp8: dy quantised (and transposed) with its amax, x re-quantised
    // transposed with the forward's scale (bit-identical codes), W^T from the quantised weights.
    // amax_ready: dy's producer already wrote its amax into the gradient slot.
    void linear_bwd(int l, Matrix m, void* dx, const void* dy, const void* x, int N, int in, int out,
                    bool amax_ready = false);
    // the amax slot a producer kernel fills for matrix m's forward input / for the gradient (null without FP8)
    float* act_amax(int l, Matrix m) const;
    float* grad_amax() const;
    void quantize_weights();  // fp8 weight copies (and transposes) from the model-dtype weights
    float* fp8_slot_ptr(int slot) const { return buf_.fp8_scales + 4 * slot; }
    void refresh_weights();  // weights = (model dtype) master
    void sync() const;
    void zero(void* p, std::size_t bytes);  // device or offloaded host memory

    ModelConfig config_;
    ModelOptions opt_;
    GpuParamLayout layout_;
    MemoryPlan plan_;
    std::string device_name_;
    std::vector<Arena> arenas_;
    GpuBuffers buf_;
    std::unique_ptr<GemmRunner> gemm_;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t staging_free_ = nullptr;
    // --use-cuda-graphs: forward_backward_ops captured once, replayed for every micro-batch
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t graph_exec_ = nullptr;
    OpTimer timer_;  // QTRAIN_TIME_BREAKDOWN=1
    uint64_t sr_seed_ = 0x5eed0fada3ull;
    bool fp8_ = false, fp8_grads_ = false;  // --matmul-dtype=e4m3; --gradient-dtype=e4m3|e5m2
};

}  // namespace qtrain
