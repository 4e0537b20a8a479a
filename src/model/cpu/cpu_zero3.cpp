// ZeRO-3 on the CPU reference model (cpu_model.h, set_communicator with zero_level 3): where the
// weights live, not how they are computed. Rank r owns the flat elements [r S, (r + 1) S) with
// S = ceil(P / W) (the block its optimizer step updates, cpu_data_parallel.cpp). Between uses the
// rest of its full-size buffers is quiet NaN: the reference keeps the memory (it is not the point)
// but makes the protocol checkable, since any read of a weight that was not gathered turns the loss
// into NaN. A gathered range holds exactly the owners' bits, so ZeRO-3 gives ZeRO-1's results.
#include <algorithm>
#include <limits>

#include "comm/communicator.h"
#include "core/error.h"
#include "model/cpu/cpu_model.h"

namespace qtrain {

namespace {

constexpr float kNotHere = std::numeric_limits<float>::quiet_NaN();

// Fills [lo, hi) outside [keep_lo, keep_hi) with NaN.
void poison_outside(float* data, int64_t lo, int64_t hi, int64_t keep_lo, int64_t keep_hi) {
    std::fill(data + lo, data + std::max(lo, std::min(hi, keep_lo)), kNotHere);
    std::fill(data + std::min(hi, std::max(lo, keep_hi)), data + hi, kNotHere);
}

}  // namespace

std::pair<int64_t, int64_t> CpuModel::owned_range() const {
    const int64_t P = num_elements();
    if (!comm_) return {0, P};
    const int64_t W = comm_->world(), S = (P + W - 1) / W, begin = std::min<int64_t>(comm_->rank() * S, P);
    return {begin, std::min<int64_t>(begin + S, P)};
}

CpuModel::Range CpuModel::embedding_range() const { return {offsets_[0], offsets_[0] + specs_[0].numel()}; }

CpuModel::Range CpuModel::layer_range(int l) const {
    const size_t first = 1 + static_cast<size_t>(l) * tensors_per_layer_, last = first + tensors_per_layer_ - 1;
    return {offsets_[first], offsets_[last] + specs_[last].numel()};
}

CpuModel::Range CpuModel::norm_range() const {
    const size_t i = 1 + static_cast<size_t>(config_.num_hidden_layers) * tensors_per_layer_;
    return {offsets_[i], offsets_[i] + specs_[i].numel()};
}

CpuModel::Range CpuModel::lm_head_range() const {
    if (config_.tie_word_embeddings) return embedding_range();
    return {offsets_.back(), offsets_.back() + specs_.back().numel()};
}

void CpuModel::gather(Range r) {
    if (!weights_sharded()) return;
    comm::Communicator& c = *comm_;
    const int64_t P = num_elements(), W = c.world(), S = (P + W - 1) / W;
    // every rank walks the owners in the same order with the same counts, so the broadcasts match
    for (int owner = 0; owner < W; ++owner) {
        const int64_t lo = std::max(r.begin, owner * S), hi = std::min({r.end, (owner + 1) * S, P});
        if (lo < hi) c.broadcast(params_.data() + lo, static_cast<size_t>(hi - lo), DType::F32, owner);
    }
}

void CpuModel::release(Range r) {
    if (!weights_sharded()) return;
    const auto [begin, end] = owned_range();
    poison_outside(params_.data(), r.begin, r.end, begin, end);
    // a layer's FP8 copy is made from the gathered layer (quantize_layer) and goes with it
    if (!fq_params_.empty()) std::fill(fq_params_.begin() + r.begin, fq_params_.begin() + r.end, kNotHere);
}

void CpuModel::shard_state() {
    if (!weights_sharded()) return;
    const auto [begin, end] = owned_range();
    for (std::vector<float>* state : {&params_, &adam_m_, &adam_v_})
        poison_outside(state->data(), 0, num_elements(), begin, end);
    std::fill(fq_params_.begin(), fq_params_.end(), kNotHere);
}

const float* CpuModel::whole(const std::vector<float>& state, std::vector<float>& scratch) const {
    if (!weights_sharded()) return state.data();
    comm::Communicator& c = *comm_;
    const int64_t P = num_elements(), W = c.world(), S = (P + W - 1) / W;
    const auto [begin, end] = owned_range();
    scratch.assign(static_cast<size_t>(S * W), 0.0f);  // the last blocks padded with zeros
    std::copy(state.begin() + begin, state.begin() + end, scratch.begin() + c.rank() * S);
    c.all_gather(scratch.data() + c.rank() * S, scratch.data(), static_cast<size_t>(S), DType::F32);
    return scratch.data();
}

}  // namespace qtrain
