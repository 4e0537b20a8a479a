// The CPU reference model's data-parallel optimizer step (cpu_model.h, set_communicator): the sums
// over ranks, the sharded AdamW and the gathers. Each element is summed over the ranks in rank order
// (comm/communicator.h), so ZeRO-1, ZeRO-2 and ZeRO-3 give the same bits, and the result equals one
// model with world x the accumulation up to the order of the micro-batch additions.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/communicator.h"
#include "core/error.h"
#include "model/cpu/cpu_model.h"
#include "model/cpu/cpu_ops.h"
#include "model/flag_names.h"

namespace qtrain {

void CpuModel::set_communicator(comm::Communicator* comm, int zero_level) {
    QT_CHECK(zero_level >= 1 && zero_level <= 3, flag(RunFlag::ZeroLevel), "=", zero_level,
             " is not supported by the CPU model's data parallel step (1, 2 or 3)");
    QT_CHECK(!frozen_base() || !comm || comm->world() <= 1 || zero_level == 1, flag(&LoraOptions::rank), "=",
             options_.lora.rank, " with ", flag(RunFlag::ZeroLevel), "=", zero_level, " on ", flag(RunFlag::Device),
             "=cpu: with several ranks the adapters are replicated and their gradient all-reduced (",
             flag(RunFlag::ZeroLevel), "=1)");
    // LoRA dropout: rank r's passes draw the masks of the global micro-batches it trains (cpu_lora.h)
    lora_.set_ranks(comm ? comm->rank() : 0, comm ? comm->world() : 1);
    if (weights_sharded()) {
        // leaving ZeRO-3 (or its world): every rank gets the whole state back from the old owners
        std::vector<float> all;
        for (std::vector<float>* state : {&params_, &adam_m_, &adam_v_}) {
            whole(*state, all);
            std::copy(all.begin(), all.begin() + num_elements(), state->begin());
        }
    }
    comm_ = comm;
    zero_level_ = zero_level;
    shard_state();  // entering ZeRO-3: keep only this rank's block
}

void CpuModel::adamw_range(const OptimizerParams& p, int64_t begin, int64_t end, const float* g, int64_t g_begin,
                           float clip_scale) {
    for (size_t i = 0; i < specs_.size(); ++i) {
        const int64_t lo = std::max(begin, offsets_[i]), hi = std::min(end, offsets_[i] + specs_[i].numel());
        if (lo >= hi) continue;  // AdamW is elementwise: a tensor's part is updated as in the whole
        cpu::adamw_update(params_.data() + lo, g + (lo - g_begin), adam_m_.data() + lo, adam_v_.data() + lo, hi - lo,
                          p.learning_rate, p.beta1, p.beta2, p.epsilon, specs_[i].decay() ? p.weight_decay : 0.0f,
                          clip_scale, p.step);
    }
}

// LoRA over several ranks: every rank holds the whole frozen base and the whole (small) adapters; the
// adapters' gradient (and --train-also's) is all-reduced in rank order, so every rank computes the
// same norm and the same replicated AdamW and keeps the same bits, with no gather afterwards.
StepStats CpuModel::lora_data_parallel_step(const OptimizerParams& p) {
    comm::Communicator& c = *comm_;
    StepStats stats;
    double loss = 0.0;
    comm::sum_scalars_over_ranks(c, &step_loss_, &loss, 1);
    stats.loss = static_cast<float>(loss);
    step_loss_ = 0.0;
    std::vector<float>& g = lora_.grads();
    c.all_reduce(g.data(), g.data(), g.size(), DType::F32);
    stats.grad_norm = static_cast<float>(std::sqrt(lora_.grad_sum_squares()));
    if (!update_allowed(stats)) {  // every rank sees the same stats: none updates
        lora_.zero_grads();
        return stats;
    }
    const float clip_scale = (p.grad_clip > 0.0f && stats.grad_norm > p.grad_clip) ? p.grad_clip / stats.grad_norm : 1.0f;
    lora_.adamw(p, clip_scale);
    return stats;
}

StepStats CpuModel::data_parallel_step(const OptimizerParams& p) {
    if (frozen_base()) return lora_data_parallel_step(p);
    comm::Communicator& c = *comm_;
    const int W = c.world(), r = c.rank();
    const int64_t P = num_elements(), S = (P + W - 1) / W, begin = std::min<int64_t>(r * S, P),
                  end = std::min<int64_t>(begin + S, P);
    // the loss and the blocks' sums of squares, combined in rank order as doubles
    auto gather_sum = [&](double x) {
        double sum = 0.0;
        comm::sum_scalars_over_ranks(c, &x, &sum, 1);
        return sum;
    };
    StepStats stats;
    stats.loss = static_cast<float>(gather_sum(step_loss_));
    step_loss_ = 0.0;

    // the summed gradients of this rank's block [begin, end), padded to S elements per rank
    std::vector<float> padded(static_cast<size_t>(S) * W, 0.0f), block(static_cast<size_t>(S));
    std::copy(grads_.begin(), grads_.end(), padded.begin());
    const float* g = nullptr;
    if (zero_level_ == 1) {  // ZeRO-2 and ZeRO-3 keep only the rank's block of the summed gradient
        c.all_reduce(padded.data(), padded.data(), padded.size(), DType::F32);
        g = padded.data() + r * S;
    } else {
        c.reduce_scatter(padded.data(), block.data(), static_cast<size_t>(S), DType::F32);
        g = block.data();
    }
    stats.grad_norm = static_cast<float>(std::sqrt(gather_sum(cpu::sum_squares(g, end - begin))));
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    if (!update_allowed(stats)) return stats;  // every rank sees the same stats: none updates

    const float clip_scale = (p.grad_clip > 0.0f && stats.grad_norm > p.grad_clip) ? p.grad_clip / stats.grad_norm : 1.0f;
    adamw_range(p, begin, end, g, begin, clip_scale);
    // ZeRO-3: the rank keeps its updated block; the next pass gathers what it needs (cpu_zero3.cpp)
    if (weights_sharded()) return stats;
    // every rank gets every block of the weights and moments back
    for (std::vector<float>* state : {&params_, &adam_m_, &adam_v_}) {
        std::copy(state->begin() + begin, state->begin() + end, block.begin());
        std::fill(block.begin() + (end - begin), block.end(), 0.0f);
        c.all_gather(block.data(), padded.data(), static_cast<size_t>(S), DType::F32);
        std::copy(padded.begin(), padded.begin() + P, state->begin());
    }
    return stats;
}

}  // namespace qtrain
