// SIGINT/SIGTERM while training: the handlers record the signal, the ranks agree on it after the step
// (step_agreement.h), write a checkpoint and exit 130. Installed by Trainer for the time it trains.
#pragma once

#include <atomic>

namespace qtrain {

class StopSignals {
public:
    // `mpirun_rank`: this process is rank `mpirun_rank` of an mpirun job of `world` ranks (-1: it is
    // not). Under mpirun a stop signal sent by mpirun itself (this process's parent: mpirun, or its
    // orted on another host) means mpirun is ending the job, and OpenMPI's mpirun then kills the ranks
    // 1 s later (odls_base_sigkill_timeout) and exits 1 whatever they return; rank 0 says so at once,
    // from the handler (the process may be killed before its step ends), with the way to stop that
    // keeps the checkpoint.
    explicit StopSignals(int mpirun_rank = -1, int world = 1);
    ~StopSignals();
    StopSignals(const StopSignals&) = delete;
    StopSignals& operator=(const StopSignals&) = delete;

    // The signal seen (0: none yet).
    static std::atomic<int>* flag();
};

}  // namespace qtrain
