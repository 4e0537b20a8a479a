#include "train/evaluation.h"

#include <cmath>
#include <vector>

namespace qtrain {

EvalResult evaluate_over_ranks(IModel& model, DataLoader& loader, int max_batches, int batch_size, int seq_len,
                               comm::Communicator& host) {
    const int rank = host.rank(), world = host.world();
    loader.restart();
    std::vector<int32_t> in, tgt;
    // this rank's loss sum (each batch's mean loss times its valid targets), valid targets and tokens
    double mine[3] = {0.0, 0.0, 0.0};
    for (int b = 0; (max_batches == 0 || b < max_batches) && loader.next_batch_no_wrap(in, tgt); ++b) {
        if (b % world != rank) continue;
        int64_t valid = 0;
        for (int32_t t : tgt) valid += t >= 0;
        if (valid == 0) continue;
        const float loss = model.evaluate(Batch{in.data(), tgt.data(), batch_size, seq_len});
        mine[0] += static_cast<double>(loss) * static_cast<double>(valid);
        mine[1] += static_cast<double>(valid);
        mine[2] += static_cast<double>(batch_size) * seq_len;
    }
    double all[3];
    comm::sum_scalars_over_ranks(host, mine, all, 3);
    return {all[1] > 0 ? static_cast<float>(all[0] / all[1]) : NAN, static_cast<int64_t>(all[2])};
}

}  // namespace qtrain
