#include "train/step_agreement.h"

namespace qtrain {

StepAgreement agree_after_step(comm::Communicator& host, bool stop_requested, int64_t valid_targets) {
    const double mine[2] = {stop_requested ? 1.0 : 0.0, static_cast<double>(valid_targets)};
    double all[2];
    comm::sum_scalars_over_ranks(host, mine, all, 2);
    return {all[0] > 0.0, static_cast<int64_t>(all[1])};
}

}  // namespace qtrain
