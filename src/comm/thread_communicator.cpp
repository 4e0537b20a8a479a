#include "comm/thread_communicator.h"

#include <cstring>
#include <vector>

#include "comm/even_split.h"
#include "comm/rank_order_sum.h"
#include "comm/byte_offset.h"
#include "core/error.h"

namespace qtrain::comm {
namespace {

using Op = ThreadWorld::Op;
using Call = ThreadWorld::Call;


class ThreadCommunicator final : public Communicator {
public:
    ThreadCommunicator(ThreadWorld& world, int rank) : world_(world), rank_(rank) {}

    int rank() const override { return rank_; }
    int world() const override { return world_.world(); }
    std::string backend() const override { return "threads"; }

protected:
    // Rank r sums its share of the elements over all ranks' sends (in rank order) into its own recv,
    // then copies that share into every peer's recv. Shares are disjoint, and a share is read in full
    // before it is written, so recv == send (in place) is safe.
    void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, void*) override {
        const Call call = next(Op::AllReduce, send, recv, count, dtype);
        const auto& calls = world_.arrive(rank_, call);
        const Share share = even_split(count, world(), rank_);
        if (share.count) {
            std::vector<const void*> sources(calls.size());
            for (std::size_t q = 0; q < calls.size(); ++q) sources[q] = at(calls[q].send, share.offset, dtype);
            std::byte* mine = at(recv, share.offset, dtype);
            sum_in_rank_order(sources.data(), world(), share.count, dtype, mine);
            for (std::size_t q = 0; q < calls.size(); ++q)
                if (static_cast<int>(q) != rank_)
                    std::memcpy(at(calls[q].recv, share.offset, dtype), mine, share.count * dtype_size(dtype));
        }
        world_.depart(rank_, call);
    }

    // Rank r sums block r of every rank's send into its recv. In place (recv == send + r * count) is
    // the one source this rank alone reads.
    void do_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, void*) override {
        const Call call = next(Op::ReduceScatter, send, recv, count, dtype);
        const auto& calls = world_.arrive(rank_, call);
        if (count) {
            std::vector<const void*> sources(calls.size());
            for (std::size_t q = 0; q < calls.size(); ++q)
                sources[q] = at(calls[q].send, static_cast<std::size_t>(rank_) * count, dtype);
            sum_in_rank_order(sources.data(), world(), count, dtype, recv);
        }
        world_.depart(rank_, call);
    }

    // Like all_reduce, but each rank writes its summed share into the root's recv only: the root's
    // work is spread over the ranks (the bits do not depend on who sums which element), and in place
    // on the root is safe for the same reason (a share is read in full by the one rank writing it).
    void do_reduce(const void* send, void* recv, std::size_t count, DType dtype, int root, void*) override {
        Call call = next(Op::Reduce, send, recv, count, dtype);
        call.root = root;
        const auto& calls = world_.arrive(rank_, call);
        const Share share = even_split(count, world(), rank_);
        if (share.count) {
            std::vector<const void*> sources(calls.size());
            for (std::size_t q = 0; q < calls.size(); ++q) sources[q] = at(calls[q].send, share.offset, dtype);
            sum_in_rank_order(sources.data(), world(), share.count, dtype, at(calls[root].recv, share.offset, dtype));
        }
        world_.depart(rank_, call);
    }

    // Rank r copies every rank's send into block q of its own recv. In place, block r already holds
    // the data (and is what the peers read), so it is not copied onto itself.
    void do_all_gather(const void* send, void* recv, std::size_t count, DType dtype, void*) override {
        const Call call = next(Op::AllGather, send, recv, count, dtype);
        const auto& calls = world_.arrive(rank_, call);
        for (std::size_t q = 0; q < calls.size(); ++q) {
            std::byte* block = at(recv, q * count, dtype);
            if (count && block != calls[q].send) std::memcpy(block, calls[q].send, count * dtype_size(dtype));
        }
        world_.depart(rank_, call);
    }

    void do_broadcast(void* buffer, std::size_t count, DType dtype, int root, void*) override {
        Call call = next(Op::Broadcast, buffer, buffer, count, dtype);
        call.root = root;
        const auto& calls = world_.arrive(rank_, call);
        if (rank_ != root && count) std::memcpy(buffer, calls[root].recv, count * dtype_size(dtype));
        world_.depart(rank_, call);
    }

    // Two meetings like the others: after one, a fast rank could publish its next call before a slow
    // one has compared this one's.
    void do_barrier() override {
        const Call call = next(Op::Barrier, nullptr, nullptr, 0, DType::U8);
        world_.arrive(rank_, call);
        world_.depart(rank_, call);
    }

private:
    Call next(Op op, const void* send, void* recv, std::size_t count, DType dtype) {
        Call c;
        c.op = op;
        c.send = send;
        c.recv = recv;
        c.count = count;
        c.dtype = dtype;
        c.seq = seq_++;
        return c;
    }

    ThreadWorld& world_;
    const int rank_;
    uint64_t seq_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_thread_communicator(ThreadWorld& world, int rank) {
    QT_CHECK(rank >= 0 && rank < world.world(), "make_thread_communicator: rank ", rank, " is not in a world of ",
             world.world());
    world.claim(rank);
    return std::make_unique<ThreadCommunicator>(world, rank);
}

}  // namespace qtrain::comm
