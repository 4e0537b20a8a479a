// How long a rank waits for the others before training starts: the TCP rendezvous under torchrun's or
// Slurm's variables (comm/tcp/tcp_communicator.h) and the creation of the GPU model's NCCL
// communicator. --rendezvous-timeout bounds it, and --comm-timeout caps it when set: a user who says
// how long a silent peer may stall a step means a missing one too.
#pragma once

#include "comm/wait_bound.h"
#include "train/train_options.h"

namespace qtrain {

// The bound and the flag(s) to name: "--rendezvous-timeout=600", or "--comm-timeout=30, which caps
// --rendezvous-timeout=600"; no bound when both are 0.
comm::WaitBound rendezvous_bound(const TrainOptions& options);

}  // namespace qtrain
