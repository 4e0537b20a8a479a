// Notices when the process of another rank on this host ends while the job runs, and says so once.
// Under mpirun a rank killed without a word (SIGKILL, the OOM killer) otherwise shows only as
// OpenMPI's own reports: mpirun's "process rank 1 ... exited on signal 9" box, and sometimes its
// shared-memory transport's "Read -1, expected N, errno = 3" from a rank that was reading from the
// dead one's memory. Ranks on other hosts cannot be watched this way (mpirun's report names them).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace qtrain::comm {

// Whether process `pid` has ended: no such process, or a zombie (ended, not yet reaped by its parent).
bool process_gone(long pid);

class PeerWatch {
public:
    struct Peer {
        int rank;
        long pid;
    };
    // Checks `peers` every `interval` on a thread of its own; the first one found gone is reported
    // through `say` (one line, starting with `me`, e.g. "rank 0 of 4"), then the watch ends.
    PeerWatch(std::string me, std::vector<Peer> peers, std::function<void(const std::string&)> say,
              std::chrono::milliseconds interval = std::chrono::milliseconds(100));
    ~PeerWatch();
    PeerWatch(const PeerWatch&) = delete;
    PeerWatch& operator=(const PeerWatch&) = delete;

    // The job is ending normally: peers may leave from now on without it being news. Call it before
    // the last meeting with the other ranks (a barrier), so no peer can have left before.
    void finishing();

private:
    void run();

    const std::string me_;
    const std::vector<Peer> peers_;
    const std::function<void(const std::string&)> say_;
    const std::chrono::milliseconds interval_;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool stop_ = false, finishing_ = false;
    std::thread thread_;
};

}  // namespace qtrain::comm
