// The GPU model (--device=cuda): Qwen2 on one GPU with fp32 master weights, model-dtype (bf16 or
// fp32) weights and activations, cuBLASLt GEMMs and the kernels of src/cuda. It follows the memory
// plan (gpu_buffers.h): everything is allocated once in the constructor, nothing in the step.
// The step never waits for the GPU except where the engine reads the loss and norm back
// (optimizer_step, evaluate).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/attention.h"
#include "cuda/op_timer.h"
#include "cuda/stream.h"
#include "model/cuda/gpu_buffers.h"
#include "model/cuda/gpu_layout.h"
#include "model/cuda/gradients.h"
#include "model/cuda/optimizer_state.h"
#include "model/cuda/residual_offload.h"
#include "model/cuda/weights.h"
#include "model/cuda/layer_matrices.h"
#include "model/cuda/layer_program.h"
#include "model/cuda/lora_adapters.h"
#include "model/cuda/param_shard.h"
#include "model/imodel.h"
#include "model/model_options.h"

namespace qtrain {

class GemmRunner;
namespace cuda {
struct AdamWArgs;
}

class CudaModel : public IModel {
public:
    CudaModel(const ModelConfig& config, const ModelOptions& options);
    ~CudaModel() override;

    // Throws naming the flag for options this backend does not implement yet.
    static void check_options(const ModelOptions& options);
    static void check_lora_options(const ModelOptions& options);  // (with --lora-rank > 0)
    static void check_lora_streaming(const ModelOptions& options);  // (--shard-weights with --lora-rank > 0)
    static MemoryPlan plan(const ModelConfig& config, const ModelOptions& options);

    const ModelConfig& config() const override { return config_; }
    std::string device_name() const override { return device_name_; }
    std::string performance_notes() const override;
    std::string take_time_breakdown() override;

    void init_random(uint64_t seed) override;
    void load_hf(const std::string& model_dir) override;
    void save_hf(const std::string& dir) const override;

    void forward_backward(const Batch& batch, float grad_scale) override;
    StepStats optimizer_step(const OptimizerParams& params) override;
    // LoRA only (the adapters' gradients and the step loss); the full model refuses (imodel.h).
    void zero_gradients() override;
    float evaluate(const Batch& batch) override;

    void save_checkpoint(const std::string& dir) const override;
    void load_checkpoint(const std::string& dir) override;

    // Data parallel (cuda_model_data_parallel.cpp): this model is rank comm->rank() of a world of
    // --gpus ranks (the plan's block sizes); comm moves device memory on the model's stream (NCCL or
    // the copy-engine backend). Must be set before the parameters are initialised or loaded: each rank
    // keeps the master weights and Adam's moments of its block of the flat space only (ZeRO-1); the
    // gradients are all-reduced after the backward (ZeRO-1) or reduced layer by layer to their owners
    // during it, each rank keeping its block (ZeRO-2, gradients.h), and the updated weights
    // all-gathered. Also at world 1 (the sharded path over a one-rank communicator:
    // the plain path's bits).
    void set_communicator(comm::Communicator* comm, int zero_level) override;
    // ZeRO-3 (zero_level 3 with --shard-weights): each rank keeps only its block of the weights and
    // gathers each layer from their owners just before use (weights.h), so forward passes, save_hf
    // and download of weights are collective. Under LoRA the frozen base's block: its bf16 weights,
    // or the FP8 base's e4m3 codes (the non-layer tensors whole on every rank).
    bool weights_sharded() const override { return weights_->sharded(); }
    // LoRA with several ranks: each holds its block of the adapters' master, so the export gathers them
    bool saves_collectively() const override { return weights_sharded() || (lora_ && shard_.world > 1); }
    // download(name, Weights | Grad): collective under ZeRO-3; refused for a ZeRO-2 gradient block.
    std::vector<float> read_tensor(const std::string& name, TensorKind kind) override {
        return download(name, kind == TensorKind::Gradient ? Which::Grad : Which::Weights);
    }

    MemoryPlan memory_plan() const override { return plan_; }

    // ---- for tests: tensors by HF name, as fp32 on the host ----
    // LoRA: the adapters by their PEFT names too (Weights and Master: the fp32 master); the frozen
    // base has no Grad, AdamM or AdamV (refused, naming the tensor); a --train-also tensor by its HF
    // name gives its fp32 state (Master, Grad, AdamM, AdamV) and Weights the base's model-dtype copy.
    enum class Which { Master, Weights, Grad, AdamM, AdamV };
    std::vector<float> download(const std::string& name, Which which) const;
    void upload_master(const std::string& name, const float* data);  // also refreshes the weight copy
    // LoRA (ModelOptions::lora): the adapters role, null without it.
    LoraAdapters* lora() { return lora_.get(); }
    bool frozen_base() const { return opt_.lora.enabled(); }
    // Forward pass of `batch`; returns the logits [B*T, V] as fp32 (for comparisons with HF).
    std::vector<float> logits(const Batch& batch);
    const GpuParamLayout& layout() const { return layout_; }
    // FP8 runs with resident weights: matrix m of layer l as the GEMMs read it, its e4m3 codes
    // (row-major; transposed, only with FP8 gradients) and {abs-max, inverse scale}.
    std::vector<uint8_t> download_fp8_matrix(int l, Matrix m, bool transposed) const;
    std::pair<float, float> fp8_matrix_scale(int l, Matrix m) const;

private:
    // Copies the batch (and, for training, the embedding-gradient grouping) to the device with the
    // micro-batch's loss and logit-gradient scales.
    void upload_batch(const Batch& batch, bool with_embedding_plan, float loss_scale, float grad_dscale);
    void forward_backward_ops(int B, int T);  // forward, LM head + loss, backward (graph-capturable)
    // CUDA graphs: the compute stream waits for the roles' side streams (cuda_model_step.cpp)
    void join_side_streams();
    void forward_backward_pass(const Batch& batch, float grad_scale);  // forward_backward but LoRA's pass count
    // for_backward: a training forward, which also keeps the FP8 transposed matrix inputs (xT)
    void forward(int B, int T, bool for_backward = false);
    // LM head + loss over all rows: *loss_acc += loss_scale * sum of row losses; with grads, writes
    // d(loss)/d(xf) into d_ln and accumulates the LM-head weight gradient.
    // The scales come from step_scalars (set by upload_batch).
    void lm_head(int N, float* loss_acc, bool with_grads);
    // Its parts (cuda_model_step.cpp): the final norm's output quantised for an FP8 LM head
    // (--lm-head-dtype=e4m3; nothing without it), a chunk's logits into buf_.logits, and a chunk's
    // backward GEMMs from its d(logits) there (dx into d_ln, dW accumulated).
    void lm_head_quantize_input(int N);
    void lm_head_logits(int r0, int rows);
    void lm_head_backward(int r0, int rows);
    void backward(int B, int T);

    // ---- one decoder layer (cuda_model_layer.cpp; docs/design.md, "The layer program") ----
    // The sizes every step of a layer uses, for a micro-batch of B x T.
    struct BlockDims {
        int B, T, N, h, qd, qkvd, I;
        float eps;
        AttentionShape shape;
    };
    BlockDims block_dims(int B, int T) const;
    // Step s of layer l's program as the forward computes it: how = Forward (the forward pass, each op
    // timed), Recompute (the same kernels inside the backward's recompute) or Renorm (a norm step's
    // normalisation of its kept residual only).
    void forward_step(int l, const LayerStep& s, StepRun how, const BlockDims& d);
    // The gradient of step s of layer l: d_res (the residual's gradient) and the scratch gradients in,
    // the parameters' gradients accumulated (grads_).
    void backward_step(int l, const LayerStep& s, const BlockDims& d);
    // The activations the --recompute-* flags dropped: the program's steps they select, in order.
    void recompute_layer(int l, const BlockDims& d);
    // The roles' per-layer calls (weights gather/get/release, residual offload, gradient slots), all
    // made here. Forward: forward_begin() before the embedding writes layer 0's input residual;
    // layer_enter(l) before the layer's steps; layer_input_written(l) after its InputNorm wrote res_in
    // (which also ends the previous layer: its output was added to the residual there); layer_exit of
    // the last layer after the final norm. Backward: layer_enter / layer_exit around the recompute and
    // the backward steps of each layer.
    enum class Pass { Forward, Backward };
    void forward_begin();
    void layer_enter(int l, Pass p);
    void layer_input_written(int l);
    void layer_exit(int l, Pass p);
    // layer l's matrix m (layer_matrices.h): its flat offset and shape
    MatrixShape matrix(int l, Matrix m) const { return layer_matrix(layout_, config_, l, m); }
    // y[N,out] = x[N,in] W^T (+ bias) for matrix m of layer l: bf16 GEMM, or with --matmul-dtype=e4m3
    // x quantised with its current amax (kept per layer for the backward) times the fp8 weight.
    // amax_ready: x's producer already wrote its amax into the layer's activation slot.
    void linear_fwd(int l, Matrix m, void* y, const void* x, const void* bias, int N, int in, int out,
                    bool amax_ready = false);
    // dx = dy W and dW += dy^T x for matrix m of layer l (x: the forward's input activation). With
    // fp8 gradients both run in fp8: dy quantised (and transposed) with its amax, x re-quantised
    // transposed with the forward's scale (bit-identical codes), W^T from the quantised weights.
    // amax_ready: dy's producer already wrote its amax into the gradient slot. dy_quantized (fp8
    // gradients): the producer also wrote dy quantised into buf_.dyq / buf_.dyTq (under LoRA dyq only) and
    // the inverse scale into the gradient slot (the SwiGLU backward does), so dy itself is not read.
    void linear_bwd(int l, Matrix m, void* dx, const void* dy, const void* x, int N, int in, int out,
                    bool amax_ready = false, bool dy_quantized = false);
    // LoRA: the adapters of matrix m's targets (q, k, v of q|k|v; gate, up of gate|up; o; down), each on
    // its column slice of the fused output y / gradient dy (row stride `out`), called by linear_fwd /
    // linear_bwd right after the base GEMMs, or, with `write`, right before them where they cover all of y
    // and dx without dropout (lora_writes_whole): they write y (dx) and the base GEMM adds onto it (beta = 1).
    // training: dropout acts (lora_training_).
    void lora_fwd(int l, Matrix m, void* y, const void* x, int N, int out, bool write);
    void lora_bwd(int l, Matrix m, void* dx, const void* dy, const void* x, int N, int out, bool write);
    bool lora_writes_whole(int l, Matrix m) const;
    // Where the gradient of flat parameter element `off` accumulates: the gradients role's; for a
    // frozen base (LoRA) the adapters' fp32 gradient of a --train-also tensor (trained_grads_), else
    // null: the norm kernels then skip their weight gradient's reduction, the embedding and LM head
    // their dW.
    float* param_grad(int64_t off) const;
    // LoRA: the adapters from the seed, or from --lora-from's PEFT adapter (after the base is set).
    void start_adapters();
    // LoRA: clip and AdamW over the adapters only (the base is frozen).
    StepStats lora_optimizer_step(const OptimizerParams& params);
    // the amax slot a producer kernel fills for matrix m's forward input / for the gradient (null without FP8)
    float* act_amax(int l, Matrix m) const;
    float* grad_amax() const;
    void create_roles();   // the role objects, once the buffers are bound
    void destroy_roles();
    float* fp8_slot_ptr(int slot) const { return buf_.fp8_scales + 4 * slot; }
    void refresh_weights();  // weights = (model dtype) master, then the weights role's copies
    void sync() const;
    void zero(void* p, std::size_t bytes);  // device or offloaded host memory
    // Copies host data in, ordered on stream_ and finished on return (the source may be reused).
    void upload(void* dst, const void* src, std::size_t bytes);
    void upload_parameters(int64_t off, const float* host, int64_t n);
    // The load's one way in for base tensor i (init_random, load_hf): upload_parameters, or for a
    // layer matrix of the FP8 base without bf16 matrices (fp8_base_only) its model-dtype values into
    // `staging` at the tensor's place in its fused matrix, which is quantised once its last tensor
    // is there (q|k|v and gate|up are adjacent in the layout's order, which the loads follow).
    void set_base_tensor(std::size_t i, const float* host, void* staging);
    // A device buffer for the largest fused layer matrix in the model dtype while the FP8 base loads
    // (null otherwise): the start of the activations arena, which no load reads and every pass
    // writes before it reads, when that is large enough (so the load needs no memory beyond the
    // plan), else its own allocation, freed with it.
    struct StagingBuffer {
        void* p = nullptr;
        bool owned = false;
        ~StagingBuffer() { if (owned) cudaFree(p); }
    };
    void make_base_staging(StagingBuffer& s) const;
    // Whether flat element off is in a layer's matrix the device keeps in e4m3 only (fp8_base_only).
    bool fp8_only_matrix(int64_t off) const {
        return weights_->matrices_fp8_only() && layout_.layer_of(off) >= 0 && layout_.in_matrix(off);
    }
    // Such a tensor's model-dtype values (as fp32) from where the load read them, on the host: --model's
    // files (load_hf) or the seed's initialisation (init_random); the download and the merged export
    // read the original base this way.
    std::vector<float> base_values_from_source(const ParamSpec& s) const;
    // dst[0, n) = host values stored as t (fp32 or bf16 rounded to nearest), device or pinned memory.
    void store_values(void* dst, DType t, const float* host, int64_t n);
    // n values of the array at base (dtype t), from element off, as fp32 on the host.
    std::vector<float> fetch_values(const void* base, DType t, int64_t off, int64_t n) const;
    // n model-dtype weights from flat offset off (collective under ZeRO-3: gathered from the owners).
    std::vector<float> download_weights(int64_t off, int64_t n) const;
    // save_hf's HF files: every tensor's `which` values (merge_lora: with the adapters merged in); with
    // the weights a rank's block (ZeRO-3, Weights::flat_is_block) collective, rank 0 writing.
    void write_weights(const std::string& dir, Which which, bool merge_lora) const;

    // ---- data parallel (cuda_model_data_parallel.cpp) ----
    // Whether the master is a rank's block rather than the whole flat space (--gpus > 1 with an fp32
    // master separate from the weights).
    bool master_is_block() const { return shard_.world > 1 && buf_.master && buf_.master != buf_.weights; }
    bool moments_are_block() const { return shard_.world > 1; }
    // The summed gradient of this rank's block (all-reduce or reduce-scatter, in place) and the
    // global norm's partial sums of squares of every rank; the global loss, summed in rank order.
    void reduce_gradients();
    float global_loss();
    void gather_weights();  // every rank's updated block of the weights into every rank's copy
    void save_block_checkpoint(const std::string& dir) const;
    void load_block_checkpoint(const std::string& dir);

    ModelConfig config_;
    ModelOptions opt_;
    GpuParamLayout layout_;
    MemoryPlan plan_;
    std::string device_name_;
    mutable bool tuning_reported_ = false;  // performance_notes() says it once
    mutable int tuning_note_calls_ = 0;
    int eager_tuning_calls_ = 0;  // micro-batches run without the graph while GEMMs are autotuned
    std::vector<Arena> arenas_;
    GpuBuffers buf_;
    std::unique_ptr<GemmRunner> gemm_;
    cuda::Stream stream_;       // the compute stream: every kernel of the step
    cuda::Event staging_free_;  // the last upload out of host_staging is done
    // --use-cuda-graphs: forward_backward_ops captured once per starting state of weight streaming
    // (Weights::StreamState; one state, so one graph, without streaming) and replayed for every
    // micro-batch that starts from that state
    struct CapturedPass {
        Weights::StreamState start, end;
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
    };
    std::vector<CapturedPass> graphs_;
    OpTimer timer_;  // QTRAIN_TIME_BREAKDOWN=1
    bool breakdown_taken_ = false;  // take_time_breakdown() had it: the destructor does not print it again
    uint64_t sr_seed_ = 0x5eed0fada3ull;
    bool fp8_ = false, fp8_grads_ = false;  // --matmul-dtype=e4m3; --gradient-dtype=e4m3|e5m2
    AttentionBackend attention_ = AttentionBackend::Flash;  // --attention, resolved (attention_choice.h)
    bool keep_xT_ = false;  // inside a training forward: linear_fwd writes the layers' xT too
    LayerProgram program_;  // the steps of every decoder layer (layer_program.h)
    RecomputeSet recompute_;  // what the backward recomputes (--recompute-*)
    std::unique_ptr<Weights> weights_;            // the layers' weights and FP8 copies (weights.h)
    std::unique_ptr<Gradients> grads_;            // where gradients accumulate (gradients.h)
    std::unique_ptr<ResidualOffload> residuals_;  // --offload-residual (residual_offload.h)
    std::unique_ptr<OptimizerState> optimizer_;  // Adam's moments and the AdamW update (optimizer_state.h)
    std::unique_ptr<LoraAdapters> lora_;         // --lora-rank (lora_adapters.h); null without LoRA
    std::unordered_map<int64_t, float*> trained_grads_;  // LoRA --train-also: base offset -> its fp32 gradient
    bool lora_training_ = false;  // the passes running now are a training pass's: LoRA dropout acts
    comm::Communicator* comm_ = nullptr;  // data parallel (set_communicator); null: one GPU, plain path
    int zero_level_ = 1;
    ParamShard shard_;  // this rank's block (the whole space at world 1)
    // Where the frozen base came from (fp8_base_only: what base_values_from_source reads again): the
    // HF directory of load_hf, else the seed of init_random.
    std::string base_dir_;
    uint64_t base_seed_ = 0;
    bool base_loaded_ = false;
};

}  // namespace qtrain
