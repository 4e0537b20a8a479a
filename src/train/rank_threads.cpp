#include "train/rank_threads.h"

#include <exception>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/thread_communicator.h"
#include "comm/thread_world.h"
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

int run_rank_threads(int world, const std::function<int(comm::Communicator&)>& rank_fn,
                     std::chrono::milliseconds timeout) {
    comm::ThreadWorld w(world, timeout);
    // every communicator first, on this thread: a failure here happens before any rank runs
    std::vector<std::unique_ptr<comm::Communicator>> comms;
    for (int r = 0; r < world; ++r) comms.push_back(comm::make_thread_communicator(w, r));
    std::vector<std::thread> threads;
    auto join_all = [&] {
        for (auto& t : threads)
            if (t.joinable()) t.join();
    };
    int code = 0;
    try {
        for (int r = 1; r < world; ++r)
            threads.emplace_back([&w, &rank_fn, &comms, r] {
                try {
                    rank_fn(*comms[r]);
                    w.leave(r);
                } catch (...) {
                    w.abort(r, describe(std::current_exception()));
                }
            });
        code = rank_fn(*comms[0]);
        w.leave(0);
    } catch (...) {
        const std::exception_ptr error = std::current_exception();
        // the others must not wait for rank 0 (a no-op when their failure is what stopped it)
        w.abort(0, describe(error));
        join_all();
        if (world == 1) std::rethrow_exception(error);  // one rank: its error as it is
        // The failure that stopped the run, naming its rank: rank 0's own, or the one rank 0 met in a
        // collective (then without the note on where rank 0 stopped). Rank 0's own keeps its kind,
        // so an internal error still reads as one.
        const std::string failure = *w.failure();
        if (w.failed_rank() != 0) throw Error(failure);
        try {
            std::rethrow_exception(error);
        } catch (const Error&) {
            throw Error(failure);
        } catch (...) {
            throw std::runtime_error(failure);
        }
    }
    join_all();
    if (auto failure = w.failure()) throw_error(*failure);
    return code;
}

}  // namespace qtrain
