#include "train/rank_threads.h"

#include <exception>

#include "comm/thread_communicator.h"
#include "core/error.h"

namespace qtrain {

StepAgreement agree_after_step(comm::Communicator& comm, bool stop_requested, int64_t valid_targets) {
    // fp32 sums are exact for these small integers (the targets of one step stay far below 2^24 per
    // rank for the CPU model's batches); doubles would need a dtype the collectives do not sum
    float v[2] = {stop_requested ? 1.0f : 0.0f, static_cast<float>(valid_targets)};
    comm.all_reduce(v, v, 2, DType::F32);
    return {v[0] > 0.0f, static_cast<int64_t>(v[1])};
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
