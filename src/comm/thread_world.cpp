#include "comm/thread_world.h"

#include "core/error.h"

namespace qtrain::comm {
namespace {

const char* op_name(ThreadWorld::Op op) {
    switch (op) {
        case ThreadWorld::Op::AllReduce: return "all_reduce";
        case ThreadWorld::Op::ReduceScatter: return "reduce_scatter";
        case ThreadWorld::Op::Reduce: return "reduce";
        case ThreadWorld::Op::AllGather: return "all_gather";
        case ThreadWorld::Op::Broadcast: return "broadcast";
        case ThreadWorld::Op::Barrier: return "barrier";
    }
    return "?";
}

std::string rank_list(const std::vector<int>& ranks) {
    std::string s;
    for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
    return s;
}

bool same_collective(const ThreadWorld::Call& a, const ThreadWorld::Call& b) {
    return a.op == b.op && a.count == b.count && a.dtype == b.dtype && a.root == b.root && a.seq == b.seq;
}

}  // namespace

ThreadWorld::ThreadWorld(int world, std::chrono::milliseconds timeout)
    : world_(world), timeout_(timeout), entered_(world > 0 ? world : 0), left_(entered_.size()),
      claimed_(entered_.size()), calls_(entered_.size()) {
    QT_CHECK(world >= 1, "ThreadWorld: the world size must be at least 1, got ", world);
    QT_CHECK(timeout.count() > 0, "ThreadWorld: the timeout must be positive, got ", timeout.count(), " ms");
}

void ThreadWorld::abort(int rank, const std::string& reason) {
    std::lock_guard lock(mutex_);
    fail_locked(rank, cat("rank ", rank, " of ", world_, " failed: ", reason));
}

void ThreadWorld::claim(int rank) {
    std::lock_guard lock(mutex_);
    QT_CHECK(rank >= 0 && rank < world_, "ThreadWorld: rank ", rank, " is not in a world of ", world_);
    QT_CHECK(!claimed_[rank], "ThreadWorld: rank ", rank, " already has a communicator (one per rank)");
    claimed_[rank] = true;
}

void ThreadWorld::keep_until_destroyed(std::shared_ptr<const void> resources) {
    std::lock_guard lock(mutex_);
    kept_.push_back(std::move(resources));
}

void ThreadWorld::leave(int rank) {
    std::lock_guard lock(mutex_);
    QT_CHECK(rank >= 0 && rank < world_, "ThreadWorld::leave: rank ", rank, " is not in a world of ", world_);
    left_[rank] = true;
    changed_.notify_all();
}

std::optional<std::string> ThreadWorld::failure() const {
    std::lock_guard lock(mutex_);
    return failure_;
}

std::optional<int> ThreadWorld::failed_rank() const {
    std::lock_guard lock(mutex_);
    if (!failure_) return std::nullopt;
    return failed_rank_;
}

void ThreadWorld::fail_locked(int rank, std::string message) {
    if (!failure_) {
        failure_ = std::move(message);
        failed_rank_ = rank;
    }
    changed_.notify_all();  // wakes every waiting rank, which then throws
}

void ThreadWorld::throw_failure_locked(int rank) const {
    throw Error(cat(*failure_, " (threads communicator: rank ", rank, " stopped)"));
}

std::string ThreadWorld::describe(const Call& call) const {
    std::string s = cat(op_name(call.op), " #", call.seq);
    if (call.op == Op::Barrier) return s;
    s += cat(" (count ", call.count, ", ", dtype_name(call.dtype));
    if (call.op == Op::Broadcast || call.op == Op::Reduce) s += cat(", root ", call.root);
    return s + ")";
}

void ThreadWorld::meet(int rank, const std::string& what, std::unique_lock<std::mutex>& lock) {
    if (failure_) throw_failure_locked(rank);
    ++entered_[rank];
    if (++waiting_ == world_) {  // the last to arrive releases the others
        waiting_ = 0;
        ++generation_;
        changed_.notify_all();
        return;
    }
    const uint64_t generation = generation_;
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    // Ranks that have not entered this meeting yet (entered fewer meetings than this rank).
    auto missing = [&] {
        std::vector<int> m;
        for (int r = 0; r < world_; ++r)
            if (entered_[r] < entered_[rank]) m.push_back(r);
        return m;
    };
    for (;;) {
        if (generation_ != generation) return;
        if (failure_) throw_failure_locked(rank);
        std::vector<int> gone;
        for (int r : missing())
            if (left_[r]) gone.push_back(r);
        if (!gone.empty()) {
            fail_locked(-1, cat("rank(s) ", rank_list(gone), " of ", world_, " returned without calling ", what,
                                ", which rank ", rank, " waits in"));
            throw_failure_locked(rank);
        }
        if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == generation &&
            !failure_) {
            fail_locked(-1, cat(what, ": rank(s) ", rank_list(missing()), " of ", world_, " did not arrive within ",
                                timeout_.count() / 1000.0, " s (the communicator's timeout)"));
            throw_failure_locked(rank);
        }
    }
}

const std::vector<ThreadWorld::Call>& ThreadWorld::arrive(int rank, const Call& call) {
    std::unique_lock lock(mutex_);
    QT_CHECK(rank >= 0 && rank < world_, "ThreadWorld: rank ", rank, " is not in a world of ", world_);
    calls_[rank] = call;
    meet(rank, describe(call), lock);
    for (int q = 1; q < world_; ++q) {
        if (same_collective(calls_[q], calls_[0])) continue;
        std::string list;
        for (int r = 0; r < world_; ++r) list += cat("; rank ", r, ": ", describe(calls_[r]));
        fail_locked(-1, cat("the ranks called different collectives", list));
        throw_failure_locked(rank);
    }
    return calls_;
}

void ThreadWorld::meet_within(int rank, const Call& call, const char* phase) {
    std::unique_lock lock(mutex_);
    meet(rank, cat(describe(call), ", ", phase), lock);
}

void ThreadWorld::depart(int rank, const Call& call) {
    std::unique_lock lock(mutex_);
    meet(rank, describe(call) + ", finishing", lock);
}

}  // namespace qtrain::comm
