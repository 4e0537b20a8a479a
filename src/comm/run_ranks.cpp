#include "comm/run_ranks.h"

#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "comm/thread_communicator.h"
#include "core/error.h"

namespace qtrain::comm {

void run_ranks(ThreadWorld& world, const RankFunction& fn) { run_ranks(world, make_thread_communicator, fn); }

void run_ranks(ThreadWorld& world, const MakeRankCommunicator& make, const RankFunction& fn) {
    // All communicators first, on this thread: a failure here happens before any rank runs.
    std::vector<std::unique_ptr<Communicator>> comms;
    for (int r = 0; r < world.world(); ++r) comms.push_back(make(world, r));

    std::vector<std::thread> threads;
    threads.reserve(comms.size());
    auto body = [&world, &fn, &comms](int r) {
        try {
            fn(*comms[r]);
            world.leave(r);
        } catch (const std::exception& e) {
            world.abort(r, e.what());
        } catch (...) {
            world.abort(r, "an exception that is not a std::exception");
        }
    };
    try {
        for (int r = 0; r < world.world(); ++r) threads.emplace_back(body, r);
    } catch (const std::exception& e) {
        // The ranks already started must be stopped (they would wait for the missing ones) and joined
        // before the error leaves, or destroying a joinable std::thread terminates the process.
        world.abort(static_cast<int>(threads.size()), cat("its thread could not be started: ", e.what()));
        for (auto& t : threads) t.join();
        throw;
    }
    for (auto& t : threads) t.join();
    if (auto failure = world.failure()) throw Error(*failure);
}

void run_ranks(int world, const RankFunction& fn, std::chrono::milliseconds timeout) {
    ThreadWorld w(world, timeout);
    run_ranks(w, fn);
}

}  // namespace qtrain::comm
