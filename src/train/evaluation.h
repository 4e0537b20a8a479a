// Evaluation split over the ranks of a run: rank r of W evaluates eval batches r, r + W, r + 2W, ...
// (of the first `max_batches`, 0 = the whole eval set), and the ranks' token-weighted loss sums are
// combined exactly (comm::sum_scalars_over_ranks, in double, rank order). So W ranks take about 1/W of
// the time, and the mean equals one rank's up to the rounding of that combination: one rank adds the
// batches' sums in batch order, W ranks in W partial sums; both are doubles, rounded once to fp32.
// When the model's weights are sharded (IModel::weights_sharded, ZeRO-3) its forward passes are
// collective: the batches go in rounds of W (batch r of a round is rank r's), and in a round where any
// rank has a batch with a valid target a rank without one evaluates a batch whose targets are all
// ignored and discards the result, so every rank makes the same calls and the loss is the same.
// With packing (--document-masking) the eval loader packs the eval files as the train loader does,
// with the same masks, and the batches carry their positions; either way the loss is the summed
// token loss over the trained tokens of the whole pass.
#pragma once

#include <functional>

#include <cstdint>

#include "comm/communicator.h"
#include "model/imodel.h"
#include "train/data_loader.h"

namespace qtrain {

struct EvalResult {
    float loss = 0.0f;   // summed token cross-entropy / valid targets of the whole pass, all ranks (NaN: none)
    int64_t tokens = 0;  // tokens of the batches that had a valid target, all ranks
};

// Collective over `host` (the trainer's communicator); `loader` is each rank's own eval loader (not
// set_rank: every rank walks the same unshuffled batches and keeps its share).
// `progress` (optional) is called after each round of batches (the --comm-timeout watchdog's feed).
EvalResult evaluate_over_ranks(IModel& model, DataLoader& loader, int max_batches, int batch_size, int seq_len,
                               comm::Communicator& host, const std::function<void()>& progress = {});

}  // namespace qtrain
