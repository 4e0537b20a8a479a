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
#include "model/cpu/cpu_rank_blocks.h"
#include "model/flag_names.h"

namespace qtrain {

void CpuModel::set_communicator(comm::Communicator* comm, int zero_level) {
    QT_CHECK(zero_level >= 1 && zero_level <= 3, flag(RunFlag::ZeroLevel), "=", zero_level,
             " is not supported by the CPU model's data parallel step (1, 2 or 3)");
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

// LoRA over several ranks (docs/design.md, "LoRA with data parallel"): every rank holds the whole
// frozen base (on the CPU at every ZeRO level: its ZeRO-3 shards trained state only, and the base's
// trained --train-also tensors are the adapters') and the whole adapters. The adapters' flat space
// (--train-also's tensors included) is split into the ranks' blocks as the full model's is: the
// gradient is summed over the ranks (ZeRO-1 all-reduces it, ZeRO-2 and 3 reduce-scatter the blocks),
// the norm combines the blocks' sums of squares in rank order, each rank's AdamW updates its block,
// and the updated values and moments are all-gathered. The same bits at every level.
StepStats CpuModel::lora_data_parallel_step(const OptimizerParams& p) {
    comm::Communicator& c = *comm_;
    const cpu::RankBlock b = cpu::rank_block(lora_.num_elements(), c.world(), c.rank());
    StepStats stats;
    stats.loss = static_cast<float>(cpu::sum_over_ranks(c, step_loss_));
    step_loss_ = 0.0;
    cpu::BlockScratch scratch;
    const float* g = cpu::sum_block_over_ranks(c, zero_level_, b, lora_.grads(), scratch);
    stats.grad_norm = static_cast<float>(std::sqrt(cpu::sum_over_ranks(c, cpu::sum_squares(g, b.end - b.begin))));
    lora_.zero_grads();
    if (!update_allowed(stats)) return stats;  // every rank sees the same stats: none updates
    const float clip_scale = (p.grad_clip > 0.0f && stats.grad_norm > p.grad_clip) ? p.grad_clip / stats.grad_norm : 1.0f;
    const std::vector<float> block(g, g + (b.end - b.begin));  // (the scratch is reused by the gathers)
    lora_.adamw_range(p, b.begin, b.end, block.data(), clip_scale);
    std::vector<float> values = lora_.values();
    cpu::all_gather_blocks(c, b, values, scratch);
    lora_.set_values(values);
    cpu::all_gather_blocks(c, b, lora_.moments_m(), scratch);
    cpu::all_gather_blocks(c, b, lora_.moments_v(), scratch);
    return stats;
}

StepStats CpuModel::data_parallel_step(const OptimizerParams& p) {
    if (frozen_base()) return lora_data_parallel_step(p);
    comm::Communicator& c = *comm_;
    const cpu::RankBlock b = cpu::rank_block(num_elements(), c.world(), c.rank());
    StepStats stats;
    // the loss and the blocks' sums of squares, combined in rank order as doubles
    stats.loss = static_cast<float>(cpu::sum_over_ranks(c, step_loss_));
    step_loss_ = 0.0;

    // the summed gradients of this rank's block [begin, end)
    cpu::BlockScratch scratch;
    const float* g = cpu::sum_block_over_ranks(c, zero_level_, b, grads_, scratch);
    stats.grad_norm = static_cast<float>(std::sqrt(cpu::sum_over_ranks(c, cpu::sum_squares(g, b.end - b.begin))));
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    if (!update_allowed(stats)) return stats;  // every rank sees the same stats: none updates

    const float clip_scale = (p.grad_clip > 0.0f && stats.grad_norm > p.grad_clip) ? p.grad_clip / stats.grad_norm : 1.0f;
    adamw_range(p, b.begin, b.end, g, b.begin, clip_scale);
    // ZeRO-3: the rank keeps its updated block; the next pass gathers what it needs (cpu_zero3.cpp)
    if (weights_sharded()) return stats;
    // every rank gets every block of the weights and moments back
    for (std::vector<float>* state : {&params_, &adam_m_, &adam_v_}) cpu::all_gather_blocks(c, b, *state, scratch);
    return stats;
}

}  // namespace qtrain
