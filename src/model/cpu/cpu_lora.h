// LoRA adapters of the CPU reference model (issue 33, model/lora.h): their fp32 master weights,
// gradients and AdamW moments in flat buffers of their own (the frozen base has none of these), and
// the forward/backward of one adapted Linear. CpuModel calls forward() right after a target's base
// matmul and backward() next to its input-gradient matmul.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/imodel.h"
#include "model/lora.h"

namespace qtrain {

class CpuLora {
public:
    CpuLora() = default;
    CpuLora(const ModelConfig& cfg, const LoraOptions& lora);

    bool enabled() const { return lora_.enabled(); }
    const LoraOptions& options() const { return lora_; }
    const std::vector<ParamSpec>& specs() const { return specs_; }
    int64_t num_elements() const { return static_cast<int64_t>(params_.size()); }

    // A from the seed (init_lora_parameter), B zero; moments and gradients zero. The --train-also
    // tensors keep their values (the base's).
    void init(uint64_t seed);

    // ---- --train-also: base tensors trained in full (LoraOptions::train_also) ----
    // They are specs() after the adapters, named as PEFT saves a modules_to_save module
    // ("base_model.model.model.norm.weight"); gradients and moments live here with the adapters'.
    // Their values live in the model's base weights once bind_base() points at them (the CPU model:
    // its forward reads them there, so there is one copy); unbound (the checkpoint export) here.
    // `base_at(name)` gives the base tensor of HF name `name`; call again when the base moves.
    template <class BaseAt>
    void bind_base(BaseAt base_at) {
        bound_.assign(specs_.size(), nullptr);
        for (size_t i = first_extra_; i < specs_.size(); ++i) bound_[i] = base_at(specs_[i].name.substr(prefix_len()));
    }
    // The gradient of base tensor `hf_name` when --train-also trains it, else nullptr.
    float* trained_grad(const std::string& hf_name);
    // Saved inputs x A^T for a B*T = N micro-batch.
    void ensure_activations(int N);
    // Dropout (LoraOptions::dropout > 0) acts in training passes only: forward_backward opens one
    // with begin_pass(true) and closes it with end_pass(), which counts it; evaluation passes
    // (begin_pass(false)) use every input. The mask of pass c, layer l, target t is drawn from
    // hash(seed, c, l, t), so it is the same in the backward, after a resume (the count is in the
    // checkpoint) and on every machine; kept inputs are scaled by 1 / (1 - p) as torch's Dropout.
    // Data parallel (set_ranks): passes() counts the passes of every rank in the global order of the
    // micro-batches (rank r of W trains micro-batch j * W + r, DataLoader::set_rank), so rank r's pass
    // draws the mask of global pass passes() + r and each pass moves the count on by W: N ranks drop
    // the elements one rank drops on the same global batch, and a checkpoint's count is the global one
    // (a resume at another number of ranks continues it).
    void begin_pass(bool training) { training_ = training; }
    void end_pass() { passes_ += training_ ? static_cast<uint64_t>(world_) : 0; training_ = false; }
    uint64_t passes() const { return passes_; }
    void set_passes(uint64_t n) { passes_ = n; }  // tests: replay a pass
    void set_ranks(int rank, int world) { rank_ = rank, world_ = world; }
    // y[N, out] += s * (drop(x) A^T) B^T for layer l's target t (nothing when t has no adapter);
    // saves drop(x) A^T.
    void forward(int l, LoraTarget t, float* y, const float* x, int N);
    // dx += mask * (s * dy B A); dA += s * (dy B)^T drop(x); dB += s * dy^T (drop(x) A^T). x is the
    // forward's input (before dropout).
    void backward(int l, LoraTarget t, float* dx, const float* dy, const float* x, int N);

    // ---- files (cpu_lora_io.cpp) ----
    // PEFT's adapter directory: adapter_config.json + adapter_model.safetensors (fp32).
    void save_adapter(const std::string& dir) const;
    // Reads a PEFT adapter written for this base, rank, alpha and targets (throws naming `flag`=dir
    // otherwise: a missing tensor, another shape, another rank); moments and gradients become zero.
    void load_adapter(const std::string& dir, const std::string& flag);
    // Checkpoints: the adapters (adapter_model.safetensors) and their AdamW moments
    // (optimizer.safetensors, "<name>.exp_avg" / ".exp_avg_sq"), nothing of the frozen base.
    void save_checkpoint(const std::string& dir) const;
    void load_checkpoint(const std::string& dir);
    // W += s * B A for every adapter, on `weights` = the base's flat fp32 parameters laid out as
    // `base_offset(name)` says (PEFT's merge_and_unload).
    template <class OffsetOf>
    void merge_into(float* weights, OffsetOf base_offset) const {
        for (int l = 0; l < cfg_.num_hidden_layers; ++l)
            for (int t = 0; t < kLoraTargets; ++t) {
                const auto target = static_cast<LoraTarget>(t);
                if (a_offset_[slot(l, target)] < 0) continue;
                merge_one(l, target, weights + base_offset("model.layers." + std::to_string(l) + "." +
                                                           lora_module_path(target) + ".weight"));
            }
    }

    // W[out, in] += s * B A of layer l's target t (nothing when it has no adapter): one tensor at a time,
    // for a model that exports tensor by tensor (the GPU model).
    void merge_one(int l, LoraTarget t, float* w) const;
    // The merged value of one base tensor `s` of the HF model, in place on its base values `w`:
    // W + s B A when it is an adapted Linear, unchanged otherwise. The merge of every export that goes
    // tensor by tensor (the GPU model's save_hf, `--export-checkpoint --merge-lora`).
    void merge_tensor(const ParamSpec& s, float* w) const;

    double grad_sum_squares() const;
    // AdamW on every adapter (weight decay as the run's: they are matrices), then zero gradients.
    void adamw(const OptimizerParams& p, float clip_scale);
    // AdamW on the elements [begin, end) of the flat space only, with their gradient g (g[0] is
    // element begin's): a data-parallel rank's block. Elementwise, so the blocks' updates are the
    // whole update's bits. The gradients are left alone.
    void adamw_range(const OptimizerParams& p, int64_t begin, int64_t end, const float* g, float clip_scale);
    // The values over the flat space (the bound --train-also tensors' from the base), and the same
    // set back (the bound ones written to the base): what the ranks all-gather after their updates.
    std::vector<float> values() const { return gathered(); }
    void set_values(const std::vector<float>& v);
    void zero_grads();

    // By PEFT name; throw naming the tensor when it is not an adapter.
    float* param(const std::string& name) { return value(index(name)); }
    float* grad(const std::string& name) { return grads_.data() + offset(name); }
    float* adam_m(const std::string& name) { return m_.data() + offset(name); }
    float* adam_v(const std::string& name) { return v_.data() + offset(name); }
    bool has(const std::string& name) const { return index_.count(name) != 0; }
    const ParamSpec& spec(const std::string& name) const { return specs_[index(name)]; }
    const std::vector<int64_t>& offsets() const { return offsets_; }
    int64_t offset(const std::string& name) const;  // of its values in params() / moments_m() / moments_v()
    std::vector<float>& params() { return params_; }
    std::vector<float>& grads() { return grads_; }
    std::vector<float>& moments_m() { return m_; }
    std::vector<float>& moments_v() { return v_; }
    const std::vector<float>& params() const { return params_; }
    const std::vector<float>& moments_m() const { return m_; }
    const std::vector<float>& moments_v() const { return v_; }

private:
    static size_t prefix_len();
    // tensor i's values: its place in params_, or the base's for a bound --train-also tensor
    float* value(size_t i) { return i < bound_.size() && bound_[i] ? bound_[i] : params_.data() + offsets_[i]; }
    const float* value(size_t i) const {
        return i < bound_.size() && bound_[i] ? bound_[i] : params_.data() + offsets_[i];
    }
    // params_ with the bound tensors' values in their places (what the files hold)
    std::vector<float> gathered() const;
    // after params_ changed wholesale (a load): the bound tensors' values to the base
    void scatter();
    bool dropping() const { return training_ && lora_.dropout > 0.0f; }
    // mask_ = the pass's mask of (l, t) over n inputs (0 or 1 / (1 - p)); xd_ = x * mask_.
    const float* dropped_input(int l, LoraTarget t, const float* x, int64_t n);
    size_t index(const std::string& name) const;
    int slot(int l, LoraTarget t) const { return l * kLoraTargets + static_cast<int>(t); }
    LoraOptions lora_;
    ModelConfig cfg_;
    std::vector<ParamSpec> specs_;
    std::vector<int64_t> offsets_;
    std::unordered_map<std::string, size_t> index_;
    size_t first_extra_ = 0;          // specs_[first_extra_..] are the --train-also tensors
    std::vector<float*> bound_;       // per spec: the base's values of a bound --train-also tensor, else null
    std::vector<int64_t> a_offset_;  // per (layer, target): offset of A (B follows it), -1 = no adapter
    std::vector<float> params_, grads_, m_, v_;
    std::vector<float> h_;   // [L, 7, N, r] x A^T of each adapter
    std::vector<float> dh_;  // [N, r] backward scratch
    int n_ = 0;              // rows h_ is sized for
    std::vector<float> mask_, xd_, dxd_;  // dropout scratch [N, in]
    bool training_ = false;
    uint64_t passes_ = 0;    // training passes since the adapters started, over all ranks (dropout masks)
    int rank_ = 0, world_ = 1;  // data parallel: this rank's place in the passes' global order
};

}  // namespace qtrain
