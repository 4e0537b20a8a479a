#include "model/cpu/cpu_lora.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"
#include "model/cpu/cpu_ops.h"
#include "core/lora_dropout.h"

namespace qtrain {

CpuLora::CpuLora(const ModelConfig& cfg, const LoraOptions& lora) : lora_(lora), cfg_(cfg) {
    if (!lora_.enabled()) return;
    check_lora(cfg, lora);
    specs_ = lora_parameters(cfg, lora);
    first_extra_ = specs_.size();
    for (ParamSpec& s : lora_train_also_parameters(cfg, lora)) specs_.push_back(std::move(s));
    int64_t total = 0;
    for (size_t i = 0; i < specs_.size(); ++i) {
        offsets_.push_back(total);
        index_[specs_[i].name] = i;
        total += specs_[i].numel();
    }
    a_offset_.assign(static_cast<size_t>(cfg.num_hidden_layers) * kLoraTargets, -1);
    for (int l = 0; l < cfg.num_hidden_layers; ++l)
        for (int t = 0; t < kLoraTargets; ++t) {
            const auto target = static_cast<LoraTarget>(t);
            if (lora_.has(target)) a_offset_[slot(l, target)] = offset(lora_tensor_name(l, target, "lora_A"));
        }
    for (auto* v : {&params_, &grads_, &m_, &v_}) v->assign(static_cast<size_t>(total), 0.0f);
}

size_t CpuLora::index(const std::string& name) const {
    auto it = index_.find(name);
    QT_CHECK(it != index_.end(), "LoRA: no adapter tensor named '", name, "'");
    return it->second;
}

int64_t CpuLora::offset(const std::string& name) const { return offsets_[index(name)]; }

size_t CpuLora::prefix_len() { return std::char_traits<char>::length(kPeftPrefix); }

float* CpuLora::trained_grad(const std::string& hf_name) {
    if (first_extra_ == specs_.size()) return nullptr;
    const auto it = index_.find(kPeftPrefix + hf_name);
    return it == index_.end() ? nullptr : grads_.data() + offsets_[it->second];
}

std::vector<float> CpuLora::gathered() const {
    std::vector<float> p = params_;
    for (size_t i = first_extra_; i < bound_.size(); ++i)
        if (bound_[i]) std::copy(bound_[i], bound_[i] + specs_[i].numel(), p.begin() + offsets_[i]);
    return p;
}

void CpuLora::scatter() {
    for (size_t i = first_extra_; i < bound_.size(); ++i)
        if (bound_[i]) std::copy(params_.begin() + offsets_[i], params_.begin() + offsets_[i] + specs_[i].numel(), bound_[i]);
}

void CpuLora::init(uint64_t seed) {
    // the adapters only: a --train-also tensor starts from the base's values
    for (size_t i = 0; i < first_extra_; ++i) init_lora_parameter(specs_[i], lora_, seed, params_.data() + offsets_[i]);
    for (auto* v : {&grads_, &m_, &v_}) std::fill(v->begin(), v->end(), 0.0f);
    passes_ = 0;
}

const float* CpuLora::dropped_input(int l, LoraTarget t, const float* x, int64_t n) {
    if (static_cast<int64_t>(mask_.size()) < n) {
        mask_.resize(static_cast<size_t>(n));
        xd_.resize(static_cast<size_t>(n));
        dxd_.resize(static_cast<size_t>(n));
    }
    // (rank r of W: the global pass of the micro-batch it trains, end_pass)
    const uint64_t pass = passes_ + static_cast<uint64_t>(rank_);
    const uint64_t stream = lora_dropout_stream(lora_.seed, pass, static_cast<uint64_t>(slot(l, t)));
    const float p = lora_.dropout, keep = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < n; ++i) {
        mask_[i] = lora_dropout_scale(stream, static_cast<uint64_t>(i), p, keep);
        xd_[i] = x[i] * mask_[i];
    }
    return xd_.data();
}

void CpuLora::ensure_activations(int N) {
    if (!enabled() || N <= n_) return;
    n_ = N;
    h_.assign(static_cast<size_t>(cfg_.num_hidden_layers) * kLoraTargets * N * lora_.rank, 0.0f);
    dh_.assign(static_cast<size_t>(N) * lora_.rank, 0.0f);
}

void CpuLora::forward(int l, LoraTarget t, float* y, const float* x, int N) {
    if (!enabled() || a_offset_[slot(l, t)] < 0) return;
    const auto [out, in] = lora_target_shape(cfg_, t);
    const int r = lora_.rank;
    const int64_t a = a_offset_[slot(l, t)], b = a + static_cast<int64_t>(r) * in;
    float* h = h_.data() + static_cast<int64_t>(slot(l, t)) * n_ * r;
    if (dropping()) x = dropped_input(l, t, x, static_cast<int64_t>(N) * in);
    cpu::lora_forward(y, h, x, params_.data() + a, params_.data() + b, N, static_cast<int>(in), static_cast<int>(out),
                      r, lora_.scale());
}

void CpuLora::backward(int l, LoraTarget t, float* dx, const float* dy, const float* x, int N) {
    if (!enabled() || a_offset_[slot(l, t)] < 0) return;
    const auto [out, in] = lora_target_shape(cfg_, t);
    const int r = lora_.rank;
    const int64_t a = a_offset_[slot(l, t)], b = a + static_cast<int64_t>(r) * in;
    const float* h = h_.data() + static_cast<int64_t>(slot(l, t)) * n_ * r;
    if (dropping()) {
        // the forward's mask again; the input gradient goes through it too
        const int64_t n = static_cast<int64_t>(N) * in;
        const float* xd = dropped_input(l, t, x, n);
        std::fill(dxd_.begin(), dxd_.begin() + n, 0.0f);
        cpu::lora_backward(dxd_.data(), grads_.data() + a, grads_.data() + b, dh_.data(), dy, xd, h, params_.data() + a,
                           params_.data() + b, N, static_cast<int>(in), static_cast<int>(out), r, lora_.scale());
        for (int64_t i = 0; i < n; ++i) dx[i] += mask_[i] * dxd_[i];
        return;
    }
    cpu::lora_backward(dx, grads_.data() + a, grads_.data() + b, dh_.data(), dy, x, h, params_.data() + a,
                       params_.data() + b, N, static_cast<int>(in), static_cast<int>(out), r, lora_.scale());
}

double CpuLora::grad_sum_squares() const { return cpu::sum_squares(grads_.data(), num_elements()); }

void CpuLora::adamw(const OptimizerParams& p, float clip_scale) {
    adamw_range(p, 0, num_elements(), grads_.data(), clip_scale);
    zero_grads();
}

void CpuLora::adamw_range(const OptimizerParams& p, int64_t begin, int64_t end, const float* g, float clip_scale) {
    for (size_t i = 0; i < specs_.size(); ++i) {
        const int64_t o = offsets_[i], lo = std::max(begin, o), hi = std::min(end, o + specs_[i].numel());
        if (lo >= hi) continue;
        cpu::adamw_update(value(i) + (lo - o), g + (lo - begin), m_.data() + lo, v_.data() + lo, hi - lo,
                          p.learning_rate, p.beta1, p.beta2, p.epsilon, specs_[i].decay() ? p.weight_decay : 0.0f,
                          clip_scale, p.step);
    }
}

void CpuLora::set_values(const std::vector<float>& v) {
    std::copy(v.begin(), v.begin() + num_elements(), params_.begin());
    scatter();
}

void CpuLora::zero_grads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

}  // namespace qtrain
