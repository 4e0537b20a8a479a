#include "train/rank_threads.h"

#include <stdexcept>

#include "comm/thread_communicator.h"
#include "core/error.h"

namespace qtrain {

namespace {

std::string describe(const std::exception_ptr& e) {
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        return x.what();
    } catch (...) {
        return "an exception that is not a std::exception";
    }
}

}  // namespace

RankThreads::RankThreads(int world, std::chrono::milliseconds timeout)
    : world_(world, timeout), errors_(static_cast<std::size_t>(world)) {
    // every communicator first, on this thread: a failure here happens before any rank runs
    for (int r = 0; r < world; ++r) comms_.push_back(comm::make_thread_communicator(world_, r));
    for (int r = 1; r < world; ++r) threads_.emplace_back([this, r] { worker(r); });
}

RankThreads::~RankThreads() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        quit_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
}

void RankThreads::worker(int rank) {
    uint64_t seen = 0;
    for (;;) {
        const RankFn* job;
        bool last, quiet;
        {
            std::unique_lock<std::mutex> lock(mu_);
            wake_.wait(lock, [&] { return quit_ || generation_ != seen; });
            if (quit_) return;
            seen = generation_;
            job = job_;
            last = job_last_;
            quiet = job_quiet_;
        }
        try {
            (*job)(rank, *comms_[rank]);
            if (last) world_.leave(rank);
        } catch (...) {
            if (!quiet) {
                errors_[rank] = std::current_exception();
                world_.abort(rank, describe(errors_[rank]));
            }
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            --pending_;
        }
        done_.notify_all();
    }
}

void RankThreads::dispatch(const RankFn& fn, bool last, bool quiet) {
    for (auto& e : errors_) e = nullptr;
    {
        std::lock_guard<std::mutex> lock(mu_);
        job_ = &fn;
        job_last_ = last;
        job_quiet_ = quiet;
        pending_ = world() - 1;
        ++generation_;
    }
    wake_.notify_all();
    try {
        fn(0, *comms_[0]);
        if (last) world_.leave(0);
    } catch (...) {
        if (!quiet) {
            errors_[0] = std::current_exception();
            // the others must not wait for rank 0 (a no-op when their failure is what stopped it)
            world_.abort(0, describe(errors_[0]));
        }
    }
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
}

void RankThreads::run_quietly(const RankFn& fn) { dispatch(fn, false, true); }

void RankThreads::run(const RankFn& fn, bool last) {
    dispatch(fn, last, false);
    if (errors_[0]) {
        if (world() == 1) std::rethrow_exception(errors_[0]);  // one rank: its error as it is
        // The failure that stopped the run, naming its rank: rank 0's own, or the one rank 0 met in a
        // collective (then without the note on where rank 0 stopped). Rank 0's own keeps its kind,
        // so an internal error still reads as one.
        const std::string failure = world_.failure().value_or(describe(errors_[0]));
        if (world_.failed_rank() != 0) throw Error(failure);
        try {
            std::rethrow_exception(errors_[0]);
        } catch (const Error&) {
            throw Error(failure);
        } catch (...) {
            throw std::runtime_error(failure);
        }
    }
    // another rank failed after rank 0 had finished (its abort recorded the failure)
    if (auto failure = world_.failure()) throw_error(*failure);
}

int run_rank_threads(int world, const std::function<int(comm::Communicator&)>& rank_fn,
                     std::chrono::milliseconds timeout) {
    RankThreads threads(world, timeout);
    int code = 0;
    threads.run(
        [&](int rank, comm::Communicator& comm) {
            const int c = rank_fn(comm);
            if (rank == 0) code = c;
        },
        /*last=*/true);
    return code;
}

}  // namespace qtrain
