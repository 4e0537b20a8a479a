#include "comm/cuda/copy_engine_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "comm/block_layout.h"
#include "comm/cuda/cuda_call.h"
#include "comm/cuda/rank_order_sum_gpu.h"
#include "comm/cuda/staging_buffer.h"
#include "comm/even_split.h"
#include "comm/byte_offset.h"
#include "core/error.h"

namespace qtrain::comm {
namespace {

using Op = ThreadWorld::Op;
using Call = ThreadWorld::Call;


const char* op_name(Op op) {
    switch (op) {
        case Op::AllReduce: return "all_reduce";
        case Op::ReduceScatter: return "reduce_scatter";
        case Op::Reduce: return "reduce";
        case Op::AllGather: return "all_gather";
        case Op::Broadcast: return "broadcast";
        case Op::Barrier: return "barrier";
    }
    return "?";
}

// What a rank shows its peers at every collective (through Call::handle): its device and the events
// their streams wait on. The same objects for the communicator's whole life; only their records change.
// They outlive it, kept by the ThreadWorld (keep_until_destroyed): a peer that has passed the last
// collective's final meeting may still be queueing its waits on `done` when this rank returns and
// destroys its communicator (seen on the H200 as cudaErrorContextIsDestroyed from cudaStreamWaitEvent).
struct Published {
    int device = 0;
    cudaEvent_t ready = nullptr;   // recorded at the call: the rank's buffers hold their inputs
    cudaEvent_t summed = nullptr;  // all_reduce: the rank's share is summed into its recv
    cudaEvent_t done = nullptr;    // the rank has finished reading its peers' buffers

    Published() = default;
    Published(const Published&) = delete;
    Published& operator=(const Published&) = delete;
    ~Published() {  // (with the world, after every rank's thread: no stream waits on them any more)
        int current = 0;
        if (cudaGetDevice(&current) != cudaSuccess) return;  // (the CUDA runtime is shutting down)
        cudaSetDevice(device);
        for (cudaEvent_t e : {ready, summed, done})
            if (e) cudaEventDestroy(e);
        cudaSetDevice(current);
    }
};

}  // namespace

struct CopyEngineState {
    ThreadWorld& world;
    const int rank;
    const int device;
    const std::string name;  // for messages
    std::shared_ptr<Published> published = std::make_shared<Published>();  // (also kept by the world)
    Published& mine = *published;
    StagingBuffer staging;
    uint64_t seq = 0;
    std::vector<int> peer_devices_seen;  // devices whose peer access this rank has settled

    CopyEngineState(ThreadWorld& w, int r, int d)
        : world(w), rank(r), device(d),
          name(cat("copy-engine communicator (rank ", r, " of ", w.world(), ", CUDA device ", d, ")")),
          staging(d, name) {}

    // Peer access lets cudaMemcpyPeerAsync go straight over NVLink/PCIe instead of through the host;
    // enabled once per peer device, where the hardware allows it.
    void enable_peer_access(int peer_device) {
        if (peer_device == device ||
            std::find(peer_devices_seen.begin(), peer_devices_seen.end(), peer_device) != peer_devices_seen.end())
            return;
        peer_devices_seen.push_back(peer_device);
        int can = 0;
        QT_COMM_CUDA(cudaDeviceCanAccessPeer(&can, device, peer_device));
        if (!can) return;
        const cudaError_t err = cudaDeviceEnablePeerAccess(peer_device, 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled) {  // another rank on this device enabled it first
            cudaGetLastError();
            return;
        }
        QT_COMM_CUDA(err);
    }
};

namespace {

// One collective's protocol on one rank (see the header): construct it at the call (records `ready`,
// meets the peers, waits for their `ready`), queue the work, then finish() (records `done`, meets
// again, waits for their `done`).
class Collective {
public:
    Collective(CopyEngineState& s, Op op, const void* send, void* recv, std::size_t count, DType dtype,
               int root, void* stream)
        : s_(s), scope_(s.device), stream_(static_cast<cudaStream_t>(stream)) {
        check_stream(op);
        call_.op = op;
        call_.send = send;
        call_.recv = recv;
        call_.count = count;
        call_.dtype = dtype;
        call_.root = root;
        call_.seq = s_.seq++;
        call_.handle = &s_.mine;
        // The staging (and this rank's events) are reused: wait for this rank's previous collective,
        // which may have been queued on another stream.
        QT_COMM_CUDA(cudaStreamWaitEvent(stream_, s_.mine.done, 0));
        QT_COMM_CUDA(cudaEventRecord(s_.mine.ready, stream_));
        calls_ = &s_.world.arrive(s_.rank, call_);
        peers_.resize(calls_->size());
        for (std::size_t q = 0; q < calls_->size(); ++q) peers_[q] = static_cast<const Published*>((*calls_)[q].handle);
        for (int q = 0; q < world(); ++q) {
            if (q == s_.rank || !reads_from(q)) continue;
            s_.enable_peer_access(peers_[q]->device);
            QT_COMM_CUDA(cudaStreamWaitEvent(stream_, peers_[q]->ready, 0));
        }
    }

    int world() const { return static_cast<int>(calls_->size()); }
    const Call& call(int q) const { return (*calls_)[static_cast<std::size_t>(q)]; }
    cudaStream_t stream() const { return stream_; }
    void* staging(std::size_t bytes) { return s_.staging.get(bytes, stream_); }

    // bytes from rank `from`'s memory (src) into this rank's (dst), on the copy engines.
    void copy(void* dst, const void* src, int from, std::size_t bytes) {
        if (bytes == 0 || dst == src) return;
        const int src_device = peers_[static_cast<std::size_t>(from)]->device;
        if (src_device == s_.device)
            QT_COMM_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
        else
            QT_COMM_CUDA(cudaMemcpyPeerAsync(dst, s_.device, src, src_device, bytes, stream_));
    }

    // all_reduce's middle meeting: this rank's share is summed; wait until the peers' are.
    void shares_summed() {
        QT_COMM_CUDA(cudaEventRecord(s_.mine.summed, stream_));
        s_.world.meet_within(s_.rank, call_, "shares summed");
        for (int q = 0; q < world(); ++q)
            if (q != s_.rank) QT_COMM_CUDA(cudaStreamWaitEvent(stream_, peers_[q]->summed, 0));
    }

    void finish() {
        QT_COMM_CUDA(cudaEventRecord(s_.mine.done, stream_));
        s_.world.depart(s_.rank, call_);
        for (int q = 0; q < world(); ++q)
            if (q != s_.rank && read_by(q)) QT_COMM_CUDA(cudaStreamWaitEvent(stream_, peers_[q]->done, 0));
    }

private:
    // Which peers this rank's stream waits for: at the start, those whose buffers it reads (their
    // `ready`); at the end, those that read its buffers (their `done`). Every peer, except in a reduce,
    // where only the root reads (every peer's send) and nobody reads the root's buffers: a non-root
    // waits for the root alone, the root for no one at the end, so a reduce per layer does not tie
    // every rank's stream to every other's.
    bool reads_from(int q) const { return call_.op != Op::Reduce || s_.rank == call_.root; }
    bool read_by(int q) const { return call_.op != Op::Reduce || q == call_.root; }

    void check_stream(Op op) const {
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        QT_COMM_CUDA(cudaStreamIsCapturing(stream_, &capture));
        QT_CHECK(capture == cudaStreamCaptureStatusNone, op_name(op), " (", s_.name,
                 "): the stream is capturing a CUDA graph, which this backend does not support: its ranks meet "
                 "on the host at every collective, and a graph replay would skip that (use the NCCL backend "
                 "for captured steps)");
        require_stream_on(stream_, s_.device, op_name(op), s_.name);
    }

    CopyEngineState& s_;
    DeviceScope scope_;
    cudaStream_t stream_;
    Call call_;
    const std::vector<Call>* calls_ = nullptr;
    std::vector<const Published*> peers_;
};

}  // namespace

CopyEngineCommunicator::CopyEngineCommunicator(ThreadWorld& world, int rank, int device) {
    QT_CHECK(rank >= 0 && rank < world.world(), "copy-engine communicator: rank ", rank, " is not in a world of ",
             world.world());
    const int devices = visible_cuda_devices();
    QT_CHECK(device >= 0 && device < devices, "copy-engine communicator (rank ", rank, "): CUDA device ", device,
             " does not exist (this process sees ", devices, ")");
    world.claim(rank);
    state_ = std::make_unique<CopyEngineState>(world, rank, device);
    DeviceScope scope(device);
    state_->mine.device = device;
    world.keep_until_destroyed(state_->published);  // (the events are destroyed with the world: Published)
    for (cudaEvent_t* e : {&state_->mine.ready, &state_->mine.summed, &state_->mine.done})
        QT_COMM_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
}

// (the staging's destructor waits for the device; the published events stay with the world)
CopyEngineCommunicator::~CopyEngineCommunicator() = default;

int CopyEngineCommunicator::rank() const { return state_->rank; }
int CopyEngineCommunicator::world() const { return state_->world.world(); }
int CopyEngineCommunicator::device() const { return state_->device; }
void CopyEngineCommunicator::reserve(std::size_t bytes) { state_->staging.reserve(bytes); }
std::size_t CopyEngineCommunicator::staging_bytes() const { return state_->staging.bytes(); }

std::size_t CopyEngineCommunicator::staging_bytes_for(std::size_t all_reduce_count, std::size_t reduce_scatter_count,
                                                      DType dtype, int world, int rank) {
    const Share share = even_split(all_reduce_count, world, rank);
    return std::max(staging_layout(share.count, world, dtype).bytes,
                    staging_layout(reduce_scatter_count, world, dtype).bytes);
}

// Share r of the elements: the peers' share r into staging, summed with this rank's into recv; then
// every peer's summed share from its recv. In place (recv == send) is safe: a peer reads share r of
// this rank's send (before `summed`), and this rank overwrites it only after waiting for that peer's
// `summed`; share r itself is read and written only by this rank's kernel, element by element.
void CopyEngineCommunicator::do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype,
                                           void* stream) {
    Collective c(*state_, Op::AllReduce, send, recv, count, dtype, 0, stream);
    const int n = c.world(), r = state_->rank;
    const std::size_t es = dtype_size(dtype);
    if (n == 1) {
        c.copy(recv, send, r, count * es);
        return c.finish();
    }
    const Share mine = even_split(count, n, r);
    if (mine.count > 0) {
        const StagingLayout layout = staging_layout(mine.count, n, dtype);
        std::byte* stage = static_cast<std::byte*>(c.staging(layout.bytes));
        for (int q = 0; q < n; ++q)
            if (q != r)
                c.copy(stage + staging_slot(q, r) * layout.stride * es, at(c.call(q).send, mine.offset, dtype), q,
                       mine.count * es);
        sum_in_rank_order_gpu({n, r, at(send, mine.offset, dtype), stage, layout.stride}, mine.count, dtype,
                              at(recv, mine.offset, dtype), c.stream());
    }
    c.shares_summed();
    for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        const Share theirs = even_split(count, n, q);
        c.copy(at(recv, theirs.offset, dtype), at(c.call(q).recv, theirs.offset, dtype), q, theirs.count * es);
    }
    c.finish();
}

// Block r of every peer's send into staging, summed with this rank's block r into recv. In place
// (recv == send + r * count) is safe: the peers read the other blocks.
void CopyEngineCommunicator::do_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                                               void* stream) {
    Collective c(*state_, Op::ReduceScatter, send, recv, count, dtype, 0, stream);
    const int n = c.world(), r = state_->rank;
    const std::size_t es = dtype_size(dtype), mine = static_cast<std::size_t>(r) * count;
    if (n == 1) {
        c.copy(recv, send, r, count * es);
        return c.finish();
    }
    if (count > 0) {
        const StagingLayout layout = staging_layout(count, n, dtype);
        std::byte* stage = static_cast<std::byte*>(c.staging(layout.bytes));
        for (int q = 0; q < n; ++q)
            if (q != r)
                c.copy(stage + staging_slot(q, r) * layout.stride * es, at(c.call(q).send, mine, dtype), q,
                       count * es);
        sum_in_rank_order_gpu({n, r, at(send, mine, dtype), stage, layout.stride}, count, dtype, recv, c.stream());
    }
    c.finish();
}

// The root copies every peer's send into staging and sums them with its own send into recv; the
// others only publish their send (their stream then waits for the root's `done`, so they may
// overwrite it right after). In place on the root (recv == send) is safe: nobody else reads it.
void CopyEngineCommunicator::do_reduce(const void* send, void* recv, std::size_t count, DType dtype, int root,
                                       void* stream) {
    Collective c(*state_, Op::Reduce, send, recv, count, dtype, root, stream);
    const int n = c.world(), r = state_->rank;
    if (r == root && n == 1) c.copy(recv, send, r, count * dtype_size(dtype));
    if (r == root && n > 1 && count > 0) {
        const StagingLayout layout = staging_layout(count, n, dtype);
        std::byte* stage = static_cast<std::byte*>(c.staging(layout.bytes));
        for (int q = 0; q < n; ++q)
            if (q != r)
                c.copy(stage + staging_slot(q, r) * layout.stride * dtype_size(dtype), c.call(q).send, q,
                       count * dtype_size(dtype));
        sum_in_rank_order_gpu({n, r, send, stage, layout.stride}, count, dtype, recv, c.stream());
    }
    c.finish();
}

// Every rank's send into block q of this rank's recv. In place, block r already holds the data
// (copy() skips a copy onto itself).
void CopyEngineCommunicator::do_all_gather(const void* send, void* recv, std::size_t count, DType dtype,
                                           void* stream) {
    Collective c(*state_, Op::AllGather, send, recv, count, dtype, 0, stream);
    const std::size_t bytes = count * dtype_size(dtype);
    for (int q = 0; q < c.world(); ++q)
        c.copy(at(recv, static_cast<std::size_t>(q) * count, dtype), q == state_->rank ? send : c.call(q).send, q,
               bytes);
    c.finish();
}

void CopyEngineCommunicator::do_broadcast(void* buffer, std::size_t count, DType dtype, int root, void* stream) {
    Collective c(*state_, Op::Broadcast, buffer, buffer, count, dtype, root, stream);
    if (state_->rank != root) c.copy(buffer, c.call(root).recv, root, count * dtype_size(dtype));
    c.finish();
}

void CopyEngineCommunicator::do_barrier() {
    Call call;
    call.op = Op::Barrier;
    call.seq = state_->seq++;
    state_->world.arrive(state_->rank, call);
    state_->world.depart(state_->rank, call);
}

void CopyEngineCommunicator::abort(const std::string& reason) { state_->world.abort(state_->rank, reason); }

std::unique_ptr<CopyEngineCommunicator> make_copy_engine_communicator(ThreadWorld& world, int rank, int device) {
    return std::make_unique<CopyEngineCommunicator>(world, rank, device);
}

}  // namespace qtrain::comm
