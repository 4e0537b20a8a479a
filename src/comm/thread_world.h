// The rendezvous of the in-process backend (threads mode: N ranks are N threads of one process). Each
// collective is two meetings: every rank publishes its call (buffers, count, dtype, root) and waits
// for all ranks (`arrive`); then each rank moves or sums its share, reading the peers' buffers directly;
// then every rank waits again (`depart`) so nobody reuses or frees a buffer a peer still reads.
//
// It never hangs on a failed peer: a rank that throws (run_ranks reports it) or calls abort() marks the
// world failed, and every rank blocked in or entering a meeting throws a qtrain::Error naming that rank
// and its reason. A meeting that some ranks do not reach within the timeout fails the world naming
// them; one that a rank can never reach (it has returned, see leave()) fails at once. Calls that do not
// match (another collective, count, dtype or root, or a rank that skipped one) fail the world too,
// listing each rank's call.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qtrain::comm {

class ThreadWorld {
public:
    static constexpr std::chrono::milliseconds kDefaultTimeout{600'000};

    explicit ThreadWorld(int world, std::chrono::milliseconds timeout = kDefaultTimeout);
    ThreadWorld(const ThreadWorld&) = delete;
    ThreadWorld& operator=(const ThreadWorld&) = delete;

    int world() const { return world_; }
    std::chrono::milliseconds timeout() const { return timeout_; }

    // Fails the world: `rank` failed because of `reason`. The first failure wins; later calls (often
    // the other ranks reporting the error the first one caused) change nothing.
    void abort(int rank, const std::string& reason);
    // `rank` will make no more calls (its function returned): a meeting waiting for it fails at once.
    void leave(int rank);
    // The message every rank throws once the world has failed; nullopt while it has not.
    std::optional<std::string> failure() const;
    // The rank the failure is attributed to (-1: a timeout or a mismatch, which name their ranks).
    std::optional<int> failed_rank() const;

    // ---- for the communicators over a ThreadWorld (thread_communicator.cpp, cuda/copy_engine_communicator.cpp) ----
    // Records that rank `rank`'s communicator exists; a second one for the same rank is an error.
    void claim(int rank);
    // Keeps what a rank's peers may still reach after that rank's communicator is gone (the copy-engine
    // backend's events: a peer leaving its last collective's final meeting still waits on them) until
    // the world itself is destroyed, after every rank's thread has ended.
    void keep_until_destroyed(std::shared_ptr<const void> resources);
    enum class Op : uint8_t { AllReduce, ReduceScatter, Reduce, AllGather, Broadcast, Barrier };
    struct Call {
        Op op = Op::Barrier;
        const void* send = nullptr;
        void* recv = nullptr;  // broadcast: the buffer
        std::size_t count = 0;
        DType dtype = DType::U8;
        int root = 0;
        uint64_t seq = 0;  // the rank's number for this collective (0, 1, ...), so a skipped one shows
        // What a backend shares besides the buffers, opaque here and not compared between ranks (the
        // copy-engine backend: its rank's device and CUDA events, which the peers' streams wait on).
        const void* handle = nullptr;
    };
    // Publishes `call` as rank `rank`'s and waits for every rank's; returns all calls, indexed by rank,
    // valid until this rank's depart() returns. Throws if the world fails or the calls do not match.
    const std::vector<Call>& arrive(int rank, const Call& call);
    // For backends whose collective has several phases (the copy-engine all-reduce: sum a share, then
    // gather the shares): one more meeting of every rank between arrive() and depart(); `phase` names
    // it in errors. The calls arrive() returned stay valid.
    void meet_within(int rank, const Call& call, const char* phase);
    // Waits until every rank has finished its share of the collective `call`.
    void depart(int rank, const Call& call);

private:
    // One meeting of all ranks; `what` names it in errors ("all_reduce #3 (arrival)").
    void meet(int rank, const std::string& what, std::unique_lock<std::mutex>& lock);
    void fail_locked(int rank, std::string message);
    [[noreturn]] void throw_failure_locked(int rank) const;
    std::string describe(const Call& call) const;

    const int world_;
    const std::chrono::milliseconds timeout_;
    mutable std::mutex mutex_;
    std::condition_variable changed_;
    int waiting_ = 0;               // ranks in the current meeting
    uint64_t generation_ = 0;       // meetings completed
    std::vector<uint64_t> entered_;  // per rank: meetings entered (a rank behind the others is missing)
    std::vector<bool> left_;
    std::vector<bool> claimed_;
    std::vector<Call> calls_;
    std::vector<std::shared_ptr<const void>> kept_;  // keep_until_destroyed
    std::optional<std::string> failure_;
    int failed_rank_ = -1;
};

}  // namespace qtrain::comm
