#include "train/evaluation.h"

#include <cmath>
#include <utility>
#include <vector>

namespace qtrain {

namespace {

int64_t valid_targets(const std::vector<int32_t>& targets) {
    int64_t valid = 0;
    for (int32_t t : targets) valid += t >= 0;
    return valid;
}

}  // namespace

EvalResult evaluate_over_ranks(IModel& model, DataLoader& loader, int max_batches, int batch_size, int seq_len,
                               comm::Communicator& host, const std::function<void()>& progress) {
    const int rank = host.rank(), world = host.world();
    // ZeRO-3: each forward pass gathers the weights from every rank (imodel.h), so every rank makes a
    // call in every round in which any rank has a batch to evaluate
    const bool collective = model.weights_sharded();
    loader.restart();
    std::vector<int32_t> in, tgt, pos, my_in, my_tgt, my_pos;  // pos: packed rows' positions (else empty)
    // this rank's loss sum (each batch's mean loss times its valid targets), valid targets and tokens
    double mine[3] = {0.0, 0.0, 0.0};
    // Rounds of `world` batches, batch r of a round rank r's. Every rank reads every batch, so all know
    // which ranks have a batch with a valid target in the round.
    for (int b = 0, round_end = world; (max_batches == 0 || b < max_batches); round_end += world) {
        int64_t my_valid = 0;
        bool anyone = false, ended = false;
        for (; b < round_end; ++b) {
            if ((max_batches != 0 && b >= max_batches) || !loader.next_batch_no_wrap(in, tgt, &pos)) {
                ended = true;
                break;
            }
            const int64_t valid = valid_targets(tgt);
            anyone = anyone || valid > 0;
            if (b % world == rank && valid > 0) {
                my_valid = valid;
                std::swap(in, my_in);
                std::swap(tgt, my_tgt);
                std::swap(pos, my_pos);
            }
        }
        if (my_valid > 0) {
            Batch batch{my_in.data(), my_tgt.data(), batch_size, seq_len};
            batch.positions = my_pos.empty() ? nullptr : my_pos.data();  // document masking
            const float loss = model.evaluate(batch);
            mine[0] += static_cast<double>(loss) * static_cast<double>(my_valid);
            mine[1] += static_cast<double>(my_valid);
            mine[2] += static_cast<double>(batch_size) * seq_len;
        } else if (collective && anyone) {
            // this rank has no batch of its own in the round: one whose targets are all ignored, so it
            // joins the others' gathers; its result is discarded
            const std::vector<int32_t> tokens(static_cast<size_t>(batch_size) * seq_len, 0),
                ignored(tokens.size(), -1);
            (void)model.evaluate(Batch{tokens.data(), ignored.data(), batch_size, seq_len});
        }
        if (progress) progress();
        if (ended) break;
    }
    double all[3];
    comm::sum_scalars_over_ranks(host, mine, all, 3);
    return {all[1] > 0 ? static_cast<float>(all[0] / all[1]) : NAN, static_cast<int64_t>(all[2])};
}

}  // namespace qtrain
