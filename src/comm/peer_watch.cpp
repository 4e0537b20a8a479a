#include "comm/peer_watch.h"

#include <signal.h>

#include <cerrno>
#include <fstream>
#include <string>

#include "core/error.h"

namespace qtrain::comm {

bool process_gone(long pid) {
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
    // A process that ended stays a zombie until its parent (mpirun) reaps it; kill(pid, 0) still
    // succeeds then. The state is the field after the command name, which may hold spaces and ')'.
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return true;  // reaped between the two looks
    const std::size_t close = line.rfind(')');
    return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

PeerWatch::PeerWatch(std::string me, std::vector<Peer> peers, std::function<void(const std::string&)> say,
                     std::chrono::milliseconds interval)
    : me_(std::move(me)), peers_(std::move(peers)), say_(std::move(say)), interval_(interval) {
    if (!peers_.empty()) thread_ = std::thread([this] { run(); });
}

PeerWatch::~PeerWatch() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void PeerWatch::finishing() {
    std::lock_guard lock(mutex_);
    finishing_ = true;
}

void PeerWatch::run() {
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, interval_, [this] { return stop_ || finishing_; })) {
        for (const Peer& p : peers_) {
            if (!process_gone(p.pid)) continue;
            say_(cat(me_, ": rank ", p.rank, " (pid ", p.pid, " on this host) has ended while the job runs; unless it ",
                     "printed an error of its own above, it was killed (SIGKILL, or the OOM killer: see dmesg) or ",
                     "crashed. The job cannot go on without it"));
            return;
        }
    }
}

}  // namespace qtrain::comm
