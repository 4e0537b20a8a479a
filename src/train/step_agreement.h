// What every rank must decide alike after an optimizer step, agreed over the trainer's host
// communicator in one exact sum (comm::sum_scalars_over_ranks): whether to stop (any rank saw
// SIGINT/SIGTERM, so all stop after the same step and write the same checkpoint) and how many targets
// the step had over all ranks (a step without any is skipped, not an error, on every rank alike).
#pragma once

#include <cstdint>

#include "comm/communicator.h"

namespace qtrain {

struct StepAgreement {
    bool stop = false;
    int64_t valid_targets = 0;
};
StepAgreement agree_after_step(comm::Communicator& host, bool stop_requested, int64_t valid_targets);

}  // namespace qtrain
