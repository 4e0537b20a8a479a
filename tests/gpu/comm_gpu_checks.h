// The collective checks of tests/comm/collective_checks.h over device buffers and a stream, for the
// GPU backends (copy engine, NCCL): every result bit for bit against the sequential rank-order
// reference of tests/comm/comm_reference.h.
//
// Each check also tests the ordering a stream-queued collective promises. Everything a rank does is
// queued on its own stream, with no host wait until the end:
//  - the send buffer is garbage (0xFF) until a copy queued just before the collective fills it, and
//    one rank (`slow`) holds its stream back for a while before that copy: a peer that read the slow
//    rank's buffer without waiting for it gets garbage, always;
//  - the send is overwritten (0x55) in stream order right after the collective (out of place: before
//    the result is even read back; a broadcast's root: at once, not checking its own buffer): a
//    rank whose collective completed while a peer still read its buffer gives that peer garbage. That
//    one is a race a missing wait would very likely lose (the overwrite starts as the peer's copy
//    does), not a certainty.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/collective_checks.h"
#include "cuda/check.h"
#include "gpu_test_util.h"

namespace qtrain::test {

// A non-blocking stream on the current device (no implicit ordering with the legacy default stream,
// so only the communicator's events order it with the peers' streams).
class RankStream {
public:
    RankStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
    ~RankStream() { cudaStreamDestroy(s_); }
    RankStream(const RankStream&) = delete;
    RankStream& operator=(const RankStream&) = delete;
    cudaStream_t get() const { return s_; }
    operator void*() const { return s_; }

private:
    cudaStream_t s_ = nullptr;
};

// Holds `stream` back for `ms` milliseconds: a host function that sleeps, queued in stream order.
inline void delay_stream(cudaStream_t stream, int ms) {
    CUDA_CHECK(cudaLaunchHostFunc(
        stream,
        [](void* p) { std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::intptr_t>(p))); },
        reinterpret_cast<void*>(static_cast<std::intptr_t>(ms))));
}

constexpr int kSlowMs = 30;

inline void fill_async(void* p, int value, std::size_t bytes, cudaStream_t s) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, value, bytes, s));
}
inline void upload_async(void* dst, const std::vector<unsigned char>& src, cudaStream_t s) {
    if (!src.empty()) CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.size(), cudaMemcpyHostToDevice, s));
}
inline void copy_async(void* dst, const void* src, std::size_t bytes, cudaStream_t s) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
}
inline void download_async(std::vector<unsigned char>& dst, const void* src, cudaStream_t s) {
    if (!dst.empty()) CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, dst.size(), cudaMemcpyDeviceToHost, s));
}

// One rank's buffer of a check: `pristine` holds the data, `buf` starts as garbage and gets the data
// by a copy queued on the stream after the slow rank's hold-back.
struct StagedInput {
    DeviceBuffer pristine, buf;
    StagedInput(const std::vector<unsigned char>& data, std::size_t buf_bytes, std::size_t offset, bool slow,
                cudaStream_t s)
        : pristine(data.size()), buf(buf_bytes) {
        upload_async(pristine.get(), data, s);
        fill_async(buf.get(), 0xFF, buf_bytes, s);
        if (slow) delay_stream(s, kSlowMs);
        copy_async(static_cast<unsigned char*>(buf.get()) + offset, pristine.get(), data.size(), s);
    }
};

// Reads `bytes` at `result` back and overwrites `send_bytes` at `send` with 0x55, in stream order
// right after the collective: the overwrite first where it does not touch the result, and waits for
// the stream.
inline std::vector<unsigned char> result_and_overwrite(const void* result, std::size_t bytes, void* send,
                                                       std::size_t send_bytes, bool overwrite_first, cudaStream_t s) {
    std::vector<unsigned char> got(bytes);
    if (overwrite_first) fill_async(send, 0x55, send_bytes, s);
    download_async(got, result, s);
    if (!overwrite_first) fill_async(send, 0x55, send_bytes, s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    return got;
}

inline void gpu_check_all_reduce(Communicator& c, cudaStream_t s, CheckLog& log, DType dtype, std::size_t count,
                                 bool in_place, uint64_t seed, int slow) {
    const std::size_t es = dtype_size(dtype), bytes = count * es;
    const ReductionCase rc = reduction_case(c, dtype, seed, count, 0, count);
    StagedInput send(rc.send, bytes, 0, c.rank() == slow, s);
    DeviceBuffer recv(bytes);
    fill_async(recv.get(), 0xFF, bytes, s);
    void* out = in_place ? send.buf.get() : recv.get();
    c.all_reduce(send.buf.get(), out, count, dtype, s);
    const auto got = result_and_overwrite(out, bytes, send.buf.get(), bytes, !in_place, s);
    log.expect_same(c, label("all_reduce", dtype, count, in_place), got.data(), rc.want.data(), count, es);
}

inline void gpu_check_reduce_scatter(Communicator& c, cudaStream_t s, CheckLog& log, DType dtype,
                                     std::size_t recv_count, bool in_place, uint64_t seed, int slow) {
    const std::size_t es = dtype_size(dtype), world = static_cast<std::size_t>(c.world());
    const std::size_t mine = static_cast<std::size_t>(c.rank()) * recv_count * es, all = world * recv_count * es;
    const ReductionCase rc = reduction_case(c, dtype, seed, world * recv_count, mine / es, recv_count);
    StagedInput send(rc.send, all, 0, c.rank() == slow, s);
    DeviceBuffer recv(recv_count * es);
    fill_async(recv.get(), 0xFF, recv_count * es, s);
    void* out = in_place ? static_cast<unsigned char*>(send.buf.get()) + mine : recv.get();
    c.reduce_scatter(send.buf.get(), out, recv_count, dtype, s);
    const auto got = result_and_overwrite(out, recv_count * es, send.buf.get(), all, !in_place, s);
    log.expect_same(c, label("reduce_scatter", dtype, recv_count, in_place), got.data(), rc.want.data(), recv_count,
                    es);
}

// The root checks its result; a non-root passes a null recv (or its send, in place) and overwrites
// its send with 0x55 at once in stream order, which must not reach the root's sum: with the root as
// the slow rank, a non-root whose stream did not wait for the root to have read its send would
// overwrite it before the root reads it.
inline void gpu_check_reduce(Communicator& c, cudaStream_t s, CheckLog& log, DType dtype, std::size_t count, int root,
                             bool in_place, uint64_t seed, int slow) {
    const std::size_t es = dtype_size(dtype), bytes = count * es;
    const ReductionCase rc = reduction_case(c, dtype, seed, count, 0, count);
    StagedInput send(rc.send, bytes, 0, c.rank() == slow, s);
    const bool is_root = c.rank() == root;
    DeviceBuffer recv(is_root ? bytes : 0);
    fill_async(recv.get(), 0xFF, recv.bytes(), s);
    void* out = in_place ? send.buf.get() : is_root ? recv.get() : nullptr;
    c.reduce(send.buf.get(), out, count, dtype, root, s);
    if (!is_root) {
        result_and_overwrite(send.buf.get(), 0, send.buf.get(), bytes, true, s);
        return;
    }
    const auto got = result_and_overwrite(out, bytes, send.buf.get(), bytes, !in_place, s);
    log.expect_same(c, label("reduce", dtype, count, in_place) + " to root " + std::to_string(root), got.data(),
                    rc.want.data(), count, es);
}

inline void gpu_check_all_gather(Communicator& c, cudaStream_t s, CheckLog& log, DType dtype, std::size_t count,
                                 bool in_place, uint64_t seed, int slow) {
    const std::size_t es = dtype_size(dtype), world = static_cast<std::size_t>(c.world());
    const std::size_t block = count * es, mine = static_cast<std::size_t>(c.rank()) * block;
    std::vector<unsigned char> want;
    for (int q = 0; q < c.world(); ++q) {
        const auto b = rank_bytes(seed, q, block);
        want.insert(want.end(), b.begin(), b.end());
    }
    const auto data = rank_bytes(seed, c.rank(), block);
    if (in_place) {  // the data goes into block r of recv, which is also the send
        StagedInput recv(data, world * block, mine, c.rank() == slow, s);
        unsigned char* send = static_cast<unsigned char*>(recv.buf.get()) + mine;
        c.all_gather(send, recv.buf.get(), count, dtype, s);
        const auto got = result_and_overwrite(recv.buf.get(), world * block, recv.buf.get(), world * block, false, s);
        log.expect_same(c, label("all_gather", dtype, count, true), got.data(), want.data(), world * count, es);
    } else {
        StagedInput send(data, block, 0, c.rank() == slow, s);
        DeviceBuffer recv(world * block);
        fill_async(recv.get(), 0xFF, world * block, s);
        c.all_gather(send.buf.get(), recv.get(), count, dtype, s);
        const auto got = result_and_overwrite(recv.get(), world * block, send.buf.get(), block, true, s);
        log.expect_same(c, label("all_gather", dtype, count, false), got.data(), want.data(), world * count, es);
    }
}

// With root_overwrites_at_once, the root overwrites its buffer right after the call and does not
// check it: the root does nothing in a broadcast but wait, so that overwrite races the peers' copies
// of its buffer as closely as a test can make it.
inline void gpu_check_broadcast(Communicator& c, cudaStream_t s, CheckLog& log, DType dtype, std::size_t count,
                                int root, uint64_t seed, int slow, bool root_overwrites_at_once = false) {
    const std::size_t es = dtype_size(dtype), bytes = count * es;
    const auto want = rank_bytes(seed, root, bytes);
    StagedInput buffer(rank_bytes(seed, c.rank(), bytes), bytes, 0, c.rank() == slow, s);
    c.broadcast(buffer.buf.get(), count, dtype, root, s);
    if (root_overwrites_at_once && c.rank() == root) {
        result_and_overwrite(buffer.buf.get(), 0, buffer.buf.get(), bytes, true, s);
        return;
    }
    const auto got = result_and_overwrite(buffer.buf.get(), bytes, buffer.buf.get(), bytes, false, s);
    log.expect_same(c, label("broadcast", dtype, count, false) + " from root " + std::to_string(root), got.data(),
                    want.data(), count, es);
}

// Every collective, both reduction dtypes (and U8 for the byte movers), in place and not, counts of
// 0, 1, 7 and 1000003 (not a multiple of anything: of the world, of a vector, of a block), every
// root (reduce, broadcast); the slow rank changes from check to check.
inline CheckLog gpu_check_everything(Communicator& c, cudaStream_t s, uint64_t seed) {
    CheckLog log;
    int turn = 0;
    auto slow = [&] { return turn++ % c.world(); };
    const DType sums[] = {DType::F32, DType::BF16};
    for (DType dtype : sums)
        for (std::size_t count : {0, 1, 7, 1000003})
            for (bool in_place : {false, true})
                gpu_check_all_reduce(c, s, log, dtype, count, in_place, seed + count, slow());
    for (DType dtype : sums)
        for (std::size_t count : {0, 1, 7, 1000003})
            for (bool in_place : {false, true})
                gpu_check_reduce_scatter(c, s, log, dtype, count, in_place, seed + 2 * count, slow());
    // The slow rank alternates between the root (its peers' overwrites race its reads) and another.
    for (DType dtype : sums)
        for (std::size_t count : {0, 1, 7, 1000003})
            for (int root = 0; root < c.world(); ++root)
                for (bool in_place : {false, true})
                    gpu_check_reduce(c, s, log, dtype, count, root, in_place, seed + 4 * count + root,
                                     (root + turn++ % 2) % c.world());
    for (DType dtype : {DType::F32, DType::BF16, DType::U8})
        for (std::size_t count : {0, 1, 7, 1000003})
            for (bool in_place : {false, true})
                gpu_check_all_gather(c, s, log, dtype, count, in_place, seed + 3 * count, slow());
    for (int root = 0; root < c.world(); ++root)
        for (DType dtype : {DType::F32, DType::U8})
            for (std::size_t count : {1, 7, 1000003})
                for (bool at_once : {false, true})
                    gpu_check_broadcast(c, s, log, dtype, count, root, seed + 5 * count + root, slow(), at_once);
    c.barrier();
    return log;
}

// Fifteen collectives queued back to back on one stream with no host wait between them: one send
// buffer serves them all, refilled (in stream order) right after each collective, and each writes
// its own result buffer, read back at the end.
inline CheckLog gpu_check_back_to_back(Communicator& c, cudaStream_t s, uint64_t seed) {
    CheckLog log;
    const int world = c.world(), rank = c.rank();
    const std::size_t w = static_cast<std::size_t>(world);
    constexpr int kRounds = 15;
    constexpr std::size_t kMaxCount = 1 + (kRounds - 1) * 3331;  // the last round's count
    DeviceBuffer send(w * kMaxCount * 4);
    fill_async(send.get(), 0xFF, send.bytes(), s);
    struct Round {
        std::string what;
        std::vector<unsigned char> want;
        DeviceBuffer pristine, result;
        std::size_t count = 0, es = 0;
    };
    std::vector<Round> rounds(kRounds);
    for (int i = 0; i < kRounds; ++i) {
        Round& rd = rounds[static_cast<std::size_t>(i)];
        const uint64_t sd = seed + 100 * static_cast<uint64_t>(i);
        const DType dtype = i % 2 == 0 ? DType::F32 : DType::BF16;
        rd.es = dtype_size(dtype);
        rd.count = 1 + static_cast<std::size_t>(i) * 3331;  // 1, 3332, ... (odd sizes)
        std::vector<unsigned char> data;
        const int op = i % 5;  // all_reduce, reduce_scatter, all_gather, broadcast, reduce (to root i % world)
        if (op == 0) {
            ReductionCase rc = reduction_case(c, dtype, sd, rd.count, 0, rd.count);
            data = std::move(rc.send);
            rd.want = std::move(rc.want);
            rd.what = label("all_reduce", dtype, rd.count, false);
        } else if (op == 1) {
            ReductionCase rc = reduction_case(c, dtype, sd, w * rd.count, static_cast<std::size_t>(rank) * rd.count,
                                              rd.count);
            data = std::move(rc.send);
            rd.want = std::move(rc.want);
            rd.what = label("reduce_scatter", dtype, rd.count, false);
        } else if (op == 2) {
            data = rank_bytes(sd, rank, rd.count * rd.es);
            for (int q = 0; q < world; ++q) {
                const auto b = rank_bytes(sd, q, rd.count * rd.es);
                rd.want.insert(rd.want.end(), b.begin(), b.end());
            }
            rd.what = label("all_gather", dtype, rd.count, false);
        } else if (op == 4) {
            ReductionCase rc = reduction_case(c, dtype, sd, rd.count, 0, rd.count);
            data = std::move(rc.send);
            if (rank == i % world) rd.want = std::move(rc.want);  // only the root has a result
            rd.what = label("reduce", dtype, rd.count, false) + " to root " + std::to_string(i % world);
        } else {
            data = rank_bytes(sd, rank, rd.count * rd.es);
            rd.want = rank_bytes(sd, i % world, rd.count * rd.es);
            rd.what = label("broadcast", dtype, rd.count, false) + " from root " + std::to_string(i % world);
        }
        rd.pristine = DeviceBuffer(data.size());
        rd.result = DeviceBuffer(rd.want.size());
        upload_async(rd.pristine.get(), data, s);
        if (rank == i % world) delay_stream(s, kSlowMs);
        if (op == 3) {  // broadcast is in place: the result buffer gets the data
            copy_async(rd.result.get(), rd.pristine.get(), data.size(), s);
            c.broadcast(rd.result.get(), rd.count, dtype, i % world, s);
            continue;
        }
        fill_async(rd.result.get(), 0xFF, rd.result.bytes(), s);
        copy_async(send.get(), rd.pristine.get(), data.size(), s);
        if (op == 0) c.all_reduce(send.get(), rd.result.get(), rd.count, dtype, s);
        if (op == 1) c.reduce_scatter(send.get(), rd.result.get(), rd.count, dtype, s);
        if (op == 2) c.all_gather(send.get(), rd.result.get(), rd.count, dtype, s);
        if (op == 4) c.reduce(send.get(), rd.want.empty() ? nullptr : rd.result.get(), rd.count, dtype, i % world, s);
        fill_async(send.get(), 0x55, send.bytes(), s);  // the next round's data replaces it anyway
    }
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (Round& rd : rounds) {
        if (rd.want.empty()) continue;  // a reduce's non-root
        std::vector<unsigned char> got(rd.want.size());
        if (!got.empty()) CUDA_CHECK(cudaMemcpy(got.data(), rd.result.get(), got.size(), cudaMemcpyDeviceToHost));
        log.expect_same(c, rd.what + " (back to back)", got.data(), rd.want.data(), rd.want.size() / rd.es, rd.es);
    }
    return log;
}

}  // namespace qtrain::test
