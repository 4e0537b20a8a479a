#include "comm/tcp/tcp_communicator.h"

#include <cstring>
#include <vector>

#include "comm/rank_order_sum.h"
#include "comm/tcp/rendezvous.h"
#include "comm/tcp/wire.h"
#include "core/error.h"

namespace qtrain::comm {
namespace {

using namespace tcp;

enum Op : uint32_t { kAllReduce = 1, kReduceScatter, kReduce, kAllGather, kBroadcast, kBarrier };
const char* op_name(uint32_t op) {
    switch (op) {
        case kAllReduce: return "all_reduce";
        case kReduceScatter: return "reduce_scatter";
        case kReduce: return "reduce";
        case kAllGather: return "all_gather";
        case kBroadcast: return "broadcast";
        case kBarrier: return "barrier";
    }
    return "an unknown collective";
}
std::string describe(const Frame& f) {
    return cat(op_name(f.op), " #", f.seq, " (count ", f.count, ", ", dtype_name(static_cast<DType>(f.dtype)), ", root ", f.root, ")");
}

std::byte* at(void* p, std::size_t bytes) { return static_cast<std::byte*>(p) + bytes; }
const std::byte* at(const void* p, std::size_t bytes) { return static_cast<const std::byte*>(p) + bytes; }

class TcpCommunicator final : public Communicator {
public:
    TcpCommunicator(const LaunchEnv& l, const TcpOptions& o)
        : rank_(l.rank), world_(l.world), io_timeout_(o.io_timeout), links_(rendezvous(l, o)) {}

    int rank() const override { return rank_; }
    int world() const override { return world_; }
    std::string backend() const override { return "tcp"; }

    void abort(const std::string& reason) override {
        if (!broken_.empty()) return;
        broken_ = cat("rank ", rank_, " aborted: ", reason);
        tell_peers(cat("rank ", rank_, " of ", world_, " failed: ", reason));
    }

protected:
    void do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, void*) override {
        const std::size_t b = count * dtype_size(dtype);
        call(kAllReduce, dtype, count, 0, [&] {
            if (rank_ != 0) return exchange(send, b, recv, b);
            const auto all = gather_raw(send, b);
            sum(all, 0, count, dtype, recv);
            for (int q = 1; q < world_; ++q) reply(q, recv, b);
        });
    }

    void do_reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, void*) override {
        const std::size_t b = recv_count * dtype_size(dtype), total = b * static_cast<std::size_t>(world_);
        call(kReduceScatter, dtype, recv_count, 0, [&] {
            if (rank_ != 0) return exchange(send, total, recv, b);
            const auto all = gather_raw(send, total);
            std::vector<std::byte> block(b);
            for (int q = 1; q < world_; ++q) {
                sum(all, static_cast<std::size_t>(q) * b, recv_count, dtype, block.data());
                reply(q, block.data(), b);
            }
            sum(all, 0, recv_count, dtype, recv);  // last: in place, recv is send's block 0
        });
    }

    void do_reduce(const void* send, void* recv, std::size_t count, DType dtype, int root, void*) override {
        const std::size_t b = count * dtype_size(dtype);
        call(kReduce, dtype, count, root, [&] {
            // Every peer hears back (the root its sum, the others nothing) so errors reach all of them.
            if (rank_ != 0) return exchange(send, b, rank_ == root ? recv : nullptr, rank_ == root ? b : 0);
            const auto all = gather_raw(send, b);
            std::vector<std::byte> out(root == 0 ? 0 : b);
            sum(all, 0, count, dtype, root == 0 ? recv : out.data());
            for (int q = 1; q < world_; ++q) reply(q, out.data(), q == root ? b : 0);
        });
    }

    void do_all_gather(const void* send, void* recv, std::size_t send_count, DType dtype, void*) override {
        const std::size_t b = send_count * dtype_size(dtype), total = b * static_cast<std::size_t>(world_);
        call(kAllGather, dtype, send_count, 0, [&] {
            if (rank_ != 0) return exchange(send, b, recv, total);
            if (b) std::memmove(recv, send, b);  // in place: the same bytes
            for (int q = 1; q < world_; ++q) receive(q, at(recv, static_cast<std::size_t>(q) * b), b);
            for (int q = 1; q < world_; ++q) reply(q, recv, total);
        });
    }

    void do_broadcast(void* buffer, std::size_t count, DType dtype, int root, void*) override {
        const std::size_t b = count * dtype_size(dtype);
        call(kBroadcast, dtype, count, root, [&] {
            if (rank_ != 0) return exchange(buffer, rank_ == root ? b : 0, buffer, rank_ == root ? 0 : b);
            for (int q = 1; q < world_; ++q) receive(q, buffer, q == root ? b : 0);
            for (int q = 1; q < world_; ++q) reply(q, buffer, q == root ? 0 : b);
        });
    }

    void do_barrier() override {
        call(kBarrier, DType::U8, 0, 0, [&] {
            if (rank_ != 0) return exchange(nullptr, 0, nullptr, 0);
            for (int q = 1; q < world_; ++q) receive(q, nullptr, 0);
            for (int q = 1; q < world_; ++q) reply(q, nullptr, 0);
        });
    }

private:
    int rank_, world_;
    std::chrono::milliseconds io_timeout_;
    Links links_;
    Frame current_;        // the collective under way (what every peer's header must match)
    uint64_t seq_ = 0;
    std::string broken_;   // why this communicator failed; every later call throws it

    Clock::time_point deadline() const { return Clock::now() + io_timeout_; }
    static std::string who(int q) { return cat("rank ", q); }

    // Runs one collective: a failure is reported to the peers (rank 0 relays it to all), and this
    // communicator refuses every later call, as its peers may be gone or mid-message.
    template <class Body>
    void call(uint32_t op, DType dtype, std::size_t count, int root, Body body) {
        current_ = Frame{kCall, op, static_cast<uint32_t>(dtype), root, count, ++seq_, 0, 0};
        QT_CHECK(broken_.empty(), "tcp communicator (rank ", rank_, " of ", world_, "): ", op_name(op),
                 " after an earlier failure: ", broken_);
        try {
            body();
        } catch (const std::exception& e) {
            broken_ = e.what();
            if (rank_ == 0) tell_peers(broken_);
            throw_error(cat("tcp communicator (rank ", rank_, " of ", world_, "): ", describe(current_),
                            " failed: ", broken_));
        }
    }

    // Peer: the header and `out`, then rank 0's answer into `in` (or the failure it reports).
    void exchange(const void* out, std::size_t out_bytes, void* in, std::size_t in_bytes) {
        const Socket& s = links_.root;
        try {
            send_all(s, &current_, sizeof current_, deadline(), who(0));
            send_all(s, out, out_bytes, deadline(), who(0));
        } catch (const Error&) {
            // Rank 0 may have failed because of another rank and closed while this one was still
            // sending: its report of why is then already here, and says more than "broken pipe".
            Frame f;
            std::string report;
            try {
                recv_all(s, &f, sizeof f, Clock::now() + std::chrono::seconds(1), who(0));
                if (f.kind == kAbort) report = abort_text(f);
            } catch (const Error&) {
            }
            if (!report.empty()) throw_error(cat("rank 0 reports: ", report));
            throw;  // the send's own error
        }
        Frame f;
        recv_all(s, &f, sizeof f, deadline(), who(0));
        if (f.kind == kAbort) throw_error(cat("rank 0 reports: ", abort_text(f)));
        QT_CHECK(f.kind == kCall && f.seq == current_.seq && f.count == in_bytes, "tcp: rank 0 answered ",
                 describe(current_), " with an unexpected message (", f.count, " bytes for #", f.seq, ")");
        recv_all(s, in, in_bytes, deadline(), who(0));
    }

    // The reason that follows an abort frame from rank q (a peer: from rank 0).
    std::string abort_text(const Frame& f, int q = 0) {
        const Socket& s = rank_ == 0 ? links_.peers[q] : links_.root;
        std::string text(std::min<uint32_t>(f.text_len, kMaxText), '\0');
        recv_all(s, text.data(), text.size(), Clock::now() + std::chrono::seconds(1), who(q));
        return text;
    }

    // Rank 0: peer q's header (checked against this rank's call) and `bytes` of its data into `dest`.
    void receive(int q, void* dest, std::size_t bytes) {
        const Socket& s = links_.peers[q];
        Frame f;
        recv_all(s, &f, sizeof f, deadline(), who(q));
        if (f.kind == kAbort) throw_error(abort_text(f, q));
        QT_CHECK(f.kind == kCall && f.op == current_.op && f.dtype == current_.dtype && f.root == current_.root &&
                     f.count == current_.count && f.seq == current_.seq,
                 "rank ", q, " called ", describe(f), " while rank 0 called ", describe(current_),
                 " (the ranks disagree on the sequence of collectives)");
        recv_all(s, dest, bytes, deadline(), who(q));
    }

    void reply(int q, const void* data, std::size_t bytes) {
        Frame f = current_;
        f.count = bytes;
        send_all(links_.peers[q], &f, sizeof f, deadline(), who(q));
        send_all(links_.peers[q], data, bytes, deadline(), who(q));
    }

    // Rank 0: every rank's `bytes` of raw data, rank 0's own in place: sources[q] points at rank q's.
    struct Raw {
        std::vector<std::byte> scratch;
        std::vector<const void*> sources;
    };
    Raw gather_raw(const void* mine, std::size_t bytes) {
        Raw r;
        r.scratch.resize(bytes * static_cast<std::size_t>(world_ - 1));
        r.sources.push_back(mine);
        for (int q = 1; q < world_; ++q) {
            std::byte* slot = r.scratch.data() + static_cast<std::size_t>(q - 1) * bytes;
            receive(q, slot, bytes);
            r.sources.push_back(slot);
        }
        return r;
    }
    // The rank-order sum of `count` elements at byte `offset` of every rank's data.
    void sum(const Raw& r, std::size_t offset, std::size_t count, DType dtype, void* out) const {
        if (!count) return;
        std::vector<const void*> sources(r.sources.size());
        for (std::size_t q = 0; q < sources.size(); ++q) sources[q] = at(r.sources[q], offset);
        sum_in_rank_order(sources.data(), world_, count, dtype, out);
    }

    // Best effort, short: the peers may already be gone.
    void tell_peers(const std::string& text) {
        const std::string t = text.substr(0, kMaxText);
        Frame f = current_;
        f.kind = kAbort;
        f.text_len = static_cast<uint32_t>(t.size());
        const auto soon = Clock::now() + std::chrono::seconds(1);
        auto tell = [&](const Socket& s) {
            if (s.valid() && try_send_all(s, &f, sizeof f, soon)) try_send_all(s, t.data(), t.size(), soon);
        };
        if (rank_ == 0)
            for (int q = 1; q < world_; ++q) tell(links_.peers[q]);
        else
            tell(links_.root);
    }
};

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(const LaunchEnv& launch, const TcpOptions& options) {
    return std::make_unique<TcpCommunicator>(launch, options);
}

}  // namespace qtrain::comm
