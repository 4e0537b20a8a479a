// The seam between the training engine and a model backend (docs/design.md, "Layers"). The engine
// never knows which device, or how many ranks, sit behind it.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/flag_names.h"
#include "model/memory_plan.h"
#include "model/model_config.h"

namespace qtrain {

namespace comm {
class Communicator;
}

// One micro-batch on the host: B rows of T tokens. targets[i] < 0 means "no loss here" (masked
// prompt tokens, padding). Pointers stay valid for the duration of the call only.
struct Batch {
    const int32_t* inputs = nullptr;
    const int32_t* targets = nullptr;
    int batch_size = 0;
    int seq_len = 0;
    // Document masking (packed rows, issue 31): the RoPE position of every token [B*T], 0 at the first
    // token of each document and +1 per token after it, so a document is a run of consecutive
    // positions and token t of a row starts its document at t - positions[t]. Query t then sees keys
    // s with t - positions[t] <= s <= t: attention never crosses a document boundary. nullptr: every
    // row is one causal sequence at positions 0..T-1 (the model needs ModelOptions::document_masking
    // to take positions).
    const int32_t* positions = nullptr;
    // > 0: the micro-batch's summed token loss is divided by this instead of by its own count of
    // valid targets (then times grad_scale). The engine (--loss-normalization=tokens) sets it to the
    // trained tokens of the whole optimizer step over all ranks with grad_scale 1 (transformers'
    // num_items_in_batch): the models sum the ranks' gradients, so the sum is the gradient of the
    // step's summed token loss / that count, and a row weighs what its trained tokens weigh. 0: the
    // micro-batch mean, as before.
    float loss_denominator = 0.0f;
};

struct OptimizerParams {
    float learning_rate = 0.0f;
    float beta1 = 0.9f;
    float beta2 = 0.95f;
    float epsilon = 1e-8f;
    float weight_decay = 0.0f;  // decoupled (AdamW), on matrices and embeddings only
    float grad_clip = 0.0f;     // global-norm clipping threshold; <= 0 disables
    int step = 1;               // 1-based Adam step, for bias correction
};

struct StepStats {
    float loss = 0.0f;       // sum over the step's micro-batches of (micro-batch mean loss * grad_scale)
    float grad_norm = 0.0f;  // global L2 norm of the gradient, before clipping
};

class IModel {
public:
    virtual ~IModel() = default;

    virtual const ModelConfig& config() const = 0;
    virtual std::string device_name() const = 0;

    // Weights: random init (deterministic in `seed`), or from a HF directory / safetensors files.
    virtual void init_random(uint64_t seed) = 0;
    virtual void load_hf(const std::string& model_dir) = 0;
    // Writes model.safetensors (HF Qwen2 names, `dtype` of the torch_dtype field) into `dir`. Under
    // data parallel the engine calls it on rank 0 only, so rank 0 must hold every weight — except
    // when saves_collectively(): then every rank calls it with the same `dir`, rank 0 writes the files
    // and the others send it their parts.
    virtual void save_hf(const std::string& dir) const = 0;

    // Forward + backward of one micro-batch; gradients are accumulated, scaled by `grad_scale`
    // (1/grad_accumulation), and the micro-batch mean loss * grad_scale is added to the step loss.
    virtual void forward_backward(const Batch& batch, float grad_scale) = 0;
    // Global-norm clip, AdamW update, then zero the gradients and the step loss. When the step is
    // broken (update_allowed is false: a non-finite loss or norm, or a norm of exactly zero, which
    // only saturated activations give) nothing is updated — weights and optimizer state stay as they
    // were — and only the gradients and the loss are cleared; the engine then stops.
    virtual StepStats optimizer_step(const OptimizerParams& params) = 0;
    // Clears the accumulated gradients and step loss without an update: the Python package's
    // compute_gradients() (gradients to read, then training goes on as if they never were). Backends
    // that cannot refuse naming the device.
    virtual void zero_gradients() {
        throw_error(cat("computing gradients without a step is not supported on ", flag(RunFlag::Device), "=",
                        device_name()));
    }
    static bool update_allowed(const StepStats& s) {
        return std::isfinite(s.loss) && std::isfinite(s.grad_norm) && s.grad_norm > 0.0f;
    }
    // Mean cross-entropy over the batch's valid targets; no gradients. Not collective: under data
    // parallel each rank evaluates its own share of the eval batches (ranks may get different counts)
    // — except when weights_sharded(): then every rank must make as many calls as the others.
    virtual float evaluate(const Batch& batch) = 0;

    // Everything needed to resume bit-for-bit: master weights and optimizer state.
    // Collective under data parallel: every rank calls it with the same `dir` (between two barriers;
    // checkpointer.h) and each rank writes its own part, under file names that do not collide with
    // the other ranks' (e.g. optimizer.rank00001.safetensors); a rank that holds nothing of its own
    // writes nothing (the CPU model's state is the same on every rank, so only its rank 0 writes;
    // under ZeRO-3 its ranks gather the state to rank 0 first).
    virtual void save_checkpoint(const std::string& dir) const = 0;
    // Called on every rank with the same `dir` (a checkpoint written by the same number of ranks);
    // each rank reads what it needs of it.
    virtual void load_checkpoint(const std::string& dir) = 0;

    virtual MemoryPlan memory_plan() const = 0;

    // Data parallel: this model is one rank of comm's world (ZeRO `zero_level`); optimizer_step then
    // works with the other ranks. `comm` is the model's communicator, which may differ from the one the
    // engine agrees on (a GPU backend's, over device memory; backends/model_backends.h,
    // ModelCommunicatorFactory); it outlives the model's use of it. Called only when there are several
    // ranks. Backends that cannot refuse with an error naming the flag.
    virtual void set_communicator(comm::Communicator* comm, int zero_level) {
        (void)comm;
        (void)zero_level;
        throw_error(
            cat(flag(&ModelOptions::gpus), " > 1 is not supported yet on ", flag(RunFlag::Device), "=", device_name()));
    }

    // ZeRO-3 (set_communicator with zero_level 3): each rank holds only its block of the weights,
    // and every forward pass gathers each layer from the ranks that own it. So forward passes are
    // collective — every rank runs as many evaluate() calls as the others (a rank without a batch of
    // its own evaluates one whose targets are all ignored, and discards the result) — and save_hf is
    // called on every rank.
    virtual bool weights_sharded() const { return false; }
    // Whether save_hf is collective (every rank calls it with the same `dir`; rank 0 writes): with
    // sharded weights, or with a trained state each rank holds only a block of (the GPU model's LoRA
    // adapters with several ranks).
    virtual bool saves_collectively() const { return weights_sharded(); }

    // For debugging (the Python package's parameters() / gradients()): tensor `name` (an HF name of
    // model/parameters.h) as fp32 on the host: the weights the forward pass uses, or the gradient
    // accumulated on this rank since the last optimizer step (before any reduction over the ranks).
    // Collective when weights_sharded() (every rank calls it for the same tensor). A backend refuses,
    // naming why, what this rank does not hold whole (a ZeRO-2 gradient block).
    enum class TensorKind { Weights, Gradient };
    virtual std::vector<float> read_tensor(const std::string& name, TensorKind kind) {
        (void)name;
        (void)kind;
        throw_error(cat("reading tensors is not supported on ", flag(RunFlag::Device), "=", device_name()));
    }

    // What the backend learnt while running that a user should see once (e.g. the GEMM autotuner's
    // findings once it has decided); asked after every step, empty when there is nothing (new) to say.
    virtual std::string performance_notes() const { return {}; }

    // The per-op-family time table of the steps run so far (QTRAIN_TIME_BREAKDOWN=1 on the GPU model,
    // cuda/op_timer.h), taken once when training ends, before the export: a run stopped after its
    // steps (a benchmark's kill during the export) still has it. Empty when the backend keeps none.
    virtual std::string take_time_breakdown() { return {}; }

    // Progress of long per-tensor work (what: "initialising", "loading", "exporting", ...; done and
    // total in parameters), reported after each tensor; the engine decides what to print. A 14B model
    // spends minutes in it.
    using Progress = std::function<void(const char* what, int64_t done, int64_t total)>;
    void set_progress(Progress progress) { progress_ = std::move(progress); }

protected:
    void report_progress(const char* what, int64_t done, int64_t total) const {
        if (progress_) progress_(what, done, total);
    }

private:
    Progress progress_;
};

}  // namespace qtrain
