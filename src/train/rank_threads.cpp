#include "train/rank_threads.h"

#include <exception>

#include "comm/thread_communicator.h"
#include "core/error.h"

namespace qtrain {

StepAgreement agree_after_step(comm::Communicator& comm, bool stop_requested, int64_t valid_targets) {
    const double mine[2] = {stop_requested ? 1.0 : 0.0, static_cast<double>(valid_targets)};
    double all[2];
    comm::sum_scalars_over_ranks(comm, mine, all, 2);
    return {all[0] > 0.0, static_cast<int64_t>(all[1])};
}

RankThreads::RankThreads(comm::ThreadWorld& world, const std::function<void(comm::Communicator&)>& fn)
    : world_(world), rank0_(comm::make_thread_communicator(world, 0)) {
    for (int r = 1; r < world.world(); ++r)
        threads_.emplace_back([this, r, fn] {
            std::unique_ptr<comm::Communicator> c;
            try {
                c = comm::make_thread_communicator(world_, r);
                fn(*c);
                world_.leave(r);
            } catch (const std::exception& e) {
                world_.abort(r, e.what());
            }
        });
}

RankThreads::~RankThreads() {
    if (!joined_) world_.abort(0, "rank 0 stopped");
    for (auto& t : threads_)
        if (t.joinable()) t.join();
}

void RankThreads::join() {
    world_.leave(0);
    for (auto& t : threads_) t.join();
    joined_ = true;
    if (auto failure = world_.failure()) throw_error(*failure);
}

}  // namespace qtrain
