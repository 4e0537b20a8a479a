#include "comm/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>

#include "comm/block_layout.h"
#include "comm/cuda/cuda_call.h"
#include "comm/cuda/rank_order_sum_gpu.h"
#include "comm/cuda/staging_buffer.h"
#include "comm/byte_offset.h"
#include "core/error.h"

namespace qtrain::comm {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId::bytes), "NcclId must hold an ncclUniqueId");

namespace {


void check_nccl(ncclResult_t result, const std::string& who, const char* what, ncclComm_t comm) {
    if (result == ncclSuccess) return;
    throw Error(cat(who, ": ", what, " failed: ", ncclGetErrorString(result), " (NCCL: ", ncclGetLastError(comm),
                    ")"));
}

ncclUniqueId to_nccl(const NcclId& id) {
    ncclUniqueId uid;
    std::memcpy(&uid, id.bytes.data(), sizeof uid);
    return uid;
}

// The probe of a bounded creation (nccl_communicator.h): a nonblocking communicator on wait.probe_id,
// polled until complete; aborted when NCCL reports an error or the bound passes, and either is thrown
// naming this rank (`name`), the bound and the setting behind it. The caller owns what it returns.
ncclComm_t join_probe(const NcclInitWait& wait, int rank, int world, const std::string& name) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t probe = nullptr;
    const auto deadline = std::chrono::steady_clock::now() + wait.bound.duration();
    ncclResult_t state = ncclCommInitRankConfig(&probe, world, to_nccl(wait.probe_id), rank, &config);
    while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        const ncclResult_t query = ncclCommGetAsyncError(probe, &state);
        if (query != ncclSuccess) state = query;
    }
    if (state == ncclSuccess) return probe;
    const std::string nccl_says = ncclGetLastError(probe);
    if (probe) ncclCommAbort(probe);  // the documented way out of a nonblocking creation, done or not
    if (state == ncclInProgress)
        throw Error(cat(name, ": the other ranks did not all join the communicator's creation within ",
                        wait.bound.seconds, " s (", wait.bound.setting, "): a rank failed or was never started, or "
                        "the ranks cannot reach each other over NCCL's network (NCCL_SOCKET_IFNAME; NCCL_DEBUG=WARN "
                        "says more)"));
    throw Error(cat(name, ": ncclCommInitRankConfig failed: ", ncclGetErrorString(state), " (NCCL: ", nccl_says,
                    "; every rank needs its own GPU and the same id)"));
#else
    (void)wait, (void)rank, (void)world, (void)name;
    return nullptr;  // no nonblocking creation before NCCL 2.14: unbounded, as ncclCommInitRank is
#endif
}

}  // namespace

NcclId nccl_unique_id() {
    ncclUniqueId uid;
    check_nccl(ncclGetUniqueId(&uid), "NCCL communicator", "ncclGetUniqueId", nullptr);
    NcclId id;
    std::memcpy(id.bytes.data(), &uid, sizeof uid);
    return id;
}

// ---- NcclThreadsWorld ----

NcclThreadsWorld::NcclThreadsWorld(std::vector<int> devices, const WaitBound& bound) : devices_(std::move(devices)) {
    const int n = world();
    QT_CHECK(n >= 1, "NCCL threads world: needs at least one rank's device");
    for (int r = 0; r < n; ++r) {
        QT_CHECK(devices_[r] >= 0, "NCCL threads world: rank ", r, " has CUDA device ", devices_[r]);
        for (int q = 0; q < r; ++q)
            QT_CHECK(devices_[q] != devices_[r], "NCCL threads world: ranks ", q, " and ", r, " are both on CUDA device ",
                     devices_[r], "; NCCL cannot run two ranks of one communicator on one device (the copy-engine ",
                     "backend can: make_copy_engine_communicator)");
    }
    const int visible = visible_cuda_devices();
    for (int r = 0; r < n; ++r)
        QT_CHECK(devices_[r] < visible, "NCCL threads world: rank ", r, "'s CUDA device ", devices_[r],
                 " does not exist (this process sees ", visible, ")");
    id_ = nccl_unique_id();
    wait_.bound = bound;
    if (bound.bounded() && n > 1) wait_.probe_id = nccl_unique_id();
    claimed_.assign(static_cast<std::size_t>(n), false);
}

int NcclThreadsWorld::device(int rank) const {
    QT_CHECK(rank >= 0 && rank < world(), "NCCL threads world: rank ", rank, " is not in a world of ", world());
    return devices_[static_cast<std::size_t>(rank)];
}

void NcclThreadsWorld::claim(int rank) {
    device(rank);  // checks the rank
    std::lock_guard lock(mutex_);
    QT_CHECK(!claimed_[static_cast<std::size_t>(rank)], "NCCL threads world: rank ", rank,
             " already has a communicator (one per rank)");
    claimed_[static_cast<std::size_t>(rank)] = true;
}

// ---- NcclCommunicator ----

struct NcclState {
    const int rank, world, device;
    const std::string name;  // for messages
    ncclComm_t comm = nullptr;
    StagingBuffer staging;
    cudaStream_t barrier_stream = nullptr;
    float* barrier_value = nullptr;  // the barrier's one-element all-reduce
    const int uncaught_at_start = std::uncaught_exceptions();

    NcclState(int r, int w, int d)
        : rank(r), world(w), device(d),
          name(cat("NCCL communicator (rank ", r, " of ", w, ", CUDA device ", d, ")")), staging(d, name) {}

    // Also the cleanup of a constructor that failed half way.
    ~NcclState() {
        int previous = -1;
        cudaGetDevice(&previous);
        cudaSetDevice(device);
        if (comm) {
            // During an exception the peers may never reach the point this rank's queued work waits
            // for: abort rather than wait for them (ncclCommDestroy flushes the queued operations).
            if (std::uncaught_exceptions() > uncaught_at_start)
                ncclCommAbort(comm);
            else
                ncclCommDestroy(comm);
        }
        if (barrier_value) cudaFree(barrier_value);
        if (barrier_stream) cudaStreamDestroy(barrier_stream);
        if (previous >= 0) cudaSetDevice(previous);
    }
    NcclState(const NcclState&) = delete;
    NcclState& operator=(const NcclState&) = delete;

    void check(ncclResult_t result, const char* what) const { check_nccl(result, name, what, comm); }

    // The peers' blocks go into staging in rank order (comm/block_layout.h); `send_block(q)` is the
    // part of this rank's send that peer q sums, `length(q)` its length (0: nothing is sent).
    template <class SendBlock, class Length>
    void exchange_blocks(SendBlock send_block, Length length, const StagingLayout& layout, std::byte* stage,
                         DType dtype, cudaStream_t stream, const char* op) const {
        const std::size_t es = dtype_size(dtype);
        check(ncclGroupStart(), op);
        try {
            for (int q = 0; q < world; ++q) {
                if (q == rank) continue;
                if (length(q) > 0) check(ncclSend(send_block(q), length(q) * es, ncclUint8, q, comm, stream), op);
                if (length(rank) > 0)
                    check(ncclRecv(stage + staging_slot(q, rank) * layout.stride * es, length(rank) * es, ncclUint8, q,
                                   comm, stream),
                          op);
            }
        } catch (...) {
            ncclGroupEnd();  // close the group before the error leaves; its own result adds nothing
            throw;
        }
        check(ncclGroupEnd(), op);
    }

    void copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) const {
        if (bytes > 0 && dst != src) QT_COMM_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    }
};

NcclCommunicator::NcclCommunicator(const NcclId& id, int rank, int world, int device, const NcclInitWait& wait) {
    QT_CHECK(world >= 1 && rank >= 0 && rank < world, "NCCL communicator: rank ", rank, " is not in a world of ",
             world);
    const int visible = visible_cuda_devices();
    QT_CHECK(device >= 0 && device < visible, "NCCL communicator (rank ", rank, "): CUDA device ", device,
             " does not exist (this process sees ", visible, ")");
    state_ = std::make_unique<NcclState>(rank, world, device);
    DeviceScope scope(device);
    // With a bound, first every rank's probe (or an error naming the bound); aborted if what follows
    // throws, destroyed once the real communicator exists.
    struct Probe {
        ncclComm_t comm = nullptr;
        ~Probe() {
            if (comm) ncclCommAbort(comm);
        }
    } probe;
    if (wait.bound.bounded() && world > 1) probe.comm = join_probe(wait, rank, world, state_->name);
    // ncclCommInitRank binds the communicator to the current device.
    const ncclResult_t init = ncclCommInitRank(&state_->comm, world, to_nccl(id), rank);
    if (init != ncclSuccess) {
        state_->comm = nullptr;
        throw Error(cat(state_->name, ": ncclCommInitRank failed: ", ncclGetErrorString(init), " (NCCL: ",
                        ncclGetLastError(nullptr), "; every rank needs its own GPU and the same id)"));
    }
    if (probe.comm) ncclCommDestroy(std::exchange(probe.comm, nullptr));  // nonblocking: finishes on its own
    QT_COMM_CUDA(cudaStreamCreateWithFlags(&state_->barrier_stream, cudaStreamNonBlocking));
    QT_COMM_CUDA(cudaMalloc(&state_->barrier_value, sizeof(float)));
    QT_COMM_CUDA(cudaMemset(state_->barrier_value, 0, sizeof(float)));
}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::world() const { return state_->world; }
int NcclCommunicator::device() const { return state_->device; }
void NcclCommunicator::reserve(std::size_t bytes) { state_->staging.reserve(bytes); }
std::size_t NcclCommunicator::staging_bytes() const { return state_->staging.bytes(); }

std::size_t NcclCommunicator::staging_bytes_for(std::size_t all_reduce_count, std::size_t reduce_scatter_count,
                                                DType dtype, int world) {
    if (world <= 1) return 0;
    const PaddedBlocks blocks = padded_blocks(all_reduce_count, world);
    std::size_t all_reduce = staging_layout(blocks.block, world, dtype).bytes;
    if (blocks.padded(world)) all_reduce += blocks.block * static_cast<std::size_t>(world) * dtype_size(dtype);
    return std::max(all_reduce, staging_layout(reduce_scatter_count, world, dtype).bytes);
}

void NcclCommunicator::do_all_reduce(const void* send, void* recv, std::size_t count, DType dtype, void* stream) {
    NcclState& s = *state_;
    DeviceScope scope(s.device);
    const auto st = static_cast<cudaStream_t>(stream);
    require_stream_on(st, s.device, "all_reduce", s.name);
    const std::size_t es = dtype_size(dtype);
    if (count == 0) return;
    if (s.world == 1) return s.copy(recv, send, count * es, st);
    const PaddedBlocks blocks = padded_blocks(count, s.world);
    const StagingLayout layout = staging_layout(blocks.block, s.world, dtype);
    const bool padded = blocks.padded(s.world);
    const std::size_t gathered_bytes = padded ? blocks.block * static_cast<std::size_t>(s.world) * es : 0;
    auto* stage = static_cast<std::byte*>(s.staging.get(layout.bytes + gathered_bytes, st));
    s.exchange_blocks([&](int q) { return at(send, blocks.offset(q), dtype); },
                      [&](int q) { return blocks.length(q); }, layout, stage, dtype, st,
                      "ncclSend/ncclRecv (all_reduce)");
    // In place (recv == send) is safe: the sends of the other blocks are done in stream order before
    // the kernel writes block r (which they do not read) and before the gather overwrites theirs.
    std::byte* gathered = padded ? stage + layout.bytes : static_cast<std::byte*>(recv);
    std::byte* mine = gathered + blocks.offset(s.rank) * es;
    sum_in_rank_order_gpu({s.world, s.rank, at(send, blocks.offset(s.rank), dtype), stage, layout.stride},
                          blocks.length(s.rank), dtype, mine, st);
    s.check(ncclAllGather(mine, gathered, blocks.block * es, ncclUint8, s.comm, st), "ncclAllGather (all_reduce)");
    if (padded) s.copy(recv, gathered, count * es, st);
}

void NcclCommunicator::do_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, void* stream) {
    NcclState& s = *state_;
    DeviceScope scope(s.device);
    const auto st = static_cast<cudaStream_t>(stream);
    require_stream_on(st, s.device, "reduce_scatter", s.name);
    const std::size_t es = dtype_size(dtype), mine = static_cast<std::size_t>(s.rank) * count;
    if (count == 0) return;
    if (s.world == 1) return s.copy(recv, send, count * es, st);
    const StagingLayout layout = staging_layout(count, s.world, dtype);
    auto* stage = static_cast<std::byte*>(s.staging.get(layout.bytes, st));
    s.exchange_blocks([&](int q) { return at(send, static_cast<std::size_t>(q) * count, dtype); },
                      [&](int) { return count; }, layout, stage, dtype, st, "ncclSend/ncclRecv (reduce_scatter)");
    // In place (recv == send + r * count): the kernel reads and writes block r element by element.
    sum_in_rank_order_gpu({s.world, s.rank, at(send, mine, dtype), stage, layout.stride}, count, dtype, recv, st);
}

void NcclCommunicator::do_reduce(const void* send, void* recv, std::size_t count, DType dtype, int root, void* stream) {
    NcclState& s = *state_;
    DeviceScope scope(s.device);
    const auto st = static_cast<cudaStream_t>(stream);
    require_stream_on(st, s.device, "reduce", s.name);
    if (count == 0) return;
    if (s.world == 1) return s.copy(recv, send, count * dtype_size(dtype), st);
    // Every rank's whole send goes to the root only (length 0 towards the others), so the root
    // receives each peer's into staging and the non-roots just send; they use no staging.
    const StagingLayout layout = staging_layout(count, s.world, dtype);
    const bool is_root = s.rank == root;
    auto* stage = is_root ? static_cast<std::byte*>(s.staging.get(layout.bytes, st)) : nullptr;
    s.exchange_blocks([&](int) { return send; }, [&](int q) { return q == root ? count : std::size_t{0}; }, layout,
                      stage, dtype, st, "ncclSend/ncclRecv (reduce)");
    // In place on the root (recv == send): the kernel reads and writes it element by element.
    if (is_root) sum_in_rank_order_gpu({s.world, s.rank, send, stage, layout.stride}, count, dtype, recv, st);
}

void NcclCommunicator::do_all_gather(const void* send, void* recv, std::size_t count, DType dtype, void* stream) {
    NcclState& s = *state_;
    DeviceScope scope(s.device);
    const auto st = static_cast<cudaStream_t>(stream);
    require_stream_on(st, s.device, "all_gather", s.name);
    const std::size_t bytes = count * dtype_size(dtype);
    if (count == 0) return;
    if (s.world == 1) return s.copy(recv, send, bytes, st);
    // NCCL's in-place convention is this interface's: send == recv + rank * count.
    s.check(ncclAllGather(send, recv, bytes, ncclUint8, s.comm, st), "ncclAllGather (all_gather)");
}

void NcclCommunicator::do_broadcast(void* buffer, std::size_t count, DType dtype, int root, void* stream) {
    NcclState& s = *state_;
    DeviceScope scope(s.device);
    const auto st = static_cast<cudaStream_t>(stream);
    require_stream_on(st, s.device, "broadcast", s.name);
    if (count == 0 || s.world == 1) return;
    s.check(ncclBroadcast(buffer, buffer, count * dtype_size(dtype), ncclUint8, root, s.comm, st),
            "ncclBroadcast (broadcast)");
}

void NcclCommunicator::do_barrier() {
    NcclState& s = *state_;
    DeviceScope scope(s.device);
    s.check(ncclAllReduce(s.barrier_value, s.barrier_value, 1, ncclFloat32, ncclSum, s.comm, s.barrier_stream),
            "ncclAllReduce (barrier)");
    QT_COMM_CUDA(cudaStreamSynchronize(s.barrier_stream));
}

std::unique_ptr<NcclCommunicator> make_nccl_communicator(const NcclId& id, int rank, int world, int device,
                                                         const NcclInitWait& wait) {
    return std::make_unique<NcclCommunicator>(id, rank, world, device, wait);
}

std::unique_ptr<NcclCommunicator> make_nccl_communicator(NcclThreadsWorld& world, int rank) {
    world.claim(rank);
    return std::make_unique<NcclCommunicator>(world.id(), rank, world.world(), world.device(rank), world.init_wait());
}

}  // namespace qtrain::comm
