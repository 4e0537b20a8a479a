// The collective checks every backend must pass, written once over a Communicator so the threads
// tests and the mpirun program run exactly the same ones. Each returns the failures it found (empty:
// passed), as text naming the collective, dtype, count, in-place or not, and the rank.
//
// Results are compared bit for bit with comm_reference.h's sequential rank-order sums; receive
// buffers start as 0xFF bytes (NaN), so an element a backend forgets to write shows too.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm_reference.h"
#include "core/dtype.h"

namespace qtrain::test {

using comm::Communicator;

struct CheckLog {
    std::vector<std::string> failures;
    int checks = 0;

    void expect_same(const Communicator& c, const std::string& what, const void* got, const void* want,
                     std::size_t count, std::size_t bytes_each) {
        ++checks;
        const std::string diff = first_difference(got, want, count, bytes_each);
        if (!diff.empty()) failures.push_back(what + " on rank " + std::to_string(c.rank()) + " of " +
                                              std::to_string(c.world()) + ": " + diff);
    }
};

inline std::string label(const char* op, DType dtype, std::size_t count, bool in_place) {
    return std::string(op) + " " + std::string(dtype_name(dtype)) + " count " + std::to_string(count) +
           (in_place ? " in place" : "");
}

// The rank's data as the buffer of `dtype` (F32 or BF16) it sends, and the reference sum of the
// elements [offset, offset + count) over all ranks, as bytes.
struct ReductionCase {
    std::vector<unsigned char> send, want;
};
inline ReductionCase reduction_case(const Communicator& c, DType dtype, uint64_t seed, std::size_t total,
                                    std::size_t offset, std::size_t count) {
    const auto data = world_data(seed, c.world(), total);
    ReductionCase rc;
    auto bytes = [](const auto& v) {
        const auto* p = reinterpret_cast<const unsigned char*>(v.data());
        return std::vector<unsigned char>(p, p + v.size() * sizeof(v[0]));
    };
    if (dtype == DType::F32) {
        rc.send = bytes(data[static_cast<std::size_t>(c.rank())]);
        rc.want = bytes(reference_sum_f32(data, offset, count));
    } else {
        rc.send = bytes(as_bf16(data[static_cast<std::size_t>(c.rank())]));
        rc.want = bytes(reference_sum_bf16(data, offset, count));
    }
    return rc;
}

inline void check_all_reduce(Communicator& c, CheckLog& log, DType dtype, std::size_t count, bool in_place,
                             uint64_t seed) {
    const std::size_t es = dtype_size(dtype);
    ReductionCase rc = reduction_case(c, dtype, seed, count, 0, count);
    std::vector<unsigned char> recv(count * es, 0xFF);
    if (in_place) {
        c.all_reduce(rc.send.data(), rc.send.data(), count, dtype);
        recv = rc.send;
    } else {
        c.all_reduce(rc.send.data(), recv.data(), count, dtype);
    }
    log.expect_same(c, label("all_reduce", dtype, count, in_place), recv.data(), rc.want.data(), count, es);
}

inline void check_reduce_scatter(Communicator& c, CheckLog& log, DType dtype, std::size_t recv_count, bool in_place,
                                 uint64_t seed) {
    const std::size_t es = dtype_size(dtype), world = static_cast<std::size_t>(c.world());
    const std::size_t mine = static_cast<std::size_t>(c.rank()) * recv_count;
    ReductionCase rc = reduction_case(c, dtype, seed, world * recv_count, mine, recv_count);
    std::vector<unsigned char> recv(recv_count * es, 0xFF);
    if (in_place) {
        unsigned char* block = rc.send.data() + mine * es;
        c.reduce_scatter(rc.send.data(), block, recv_count, dtype);
        recv.assign(block, block + recv_count * es);
    } else {
        c.reduce_scatter(rc.send.data(), recv.data(), recv_count, dtype);
    }
    log.expect_same(c, label("reduce_scatter", dtype, recv_count, in_place), recv.data(), rc.want.data(), recv_count,
                    es);
}

// How the ranks call a reduce: out of place (the non-roots pass a recv of 0xFF bytes, which must stay
// so), in place (every rank passes recv == send; a non-root's send must stay as it was), or with the
// non-roots' recv null.
enum class ReduceMode { OutOfPlace, InPlace, NullOnPeers };

inline void check_reduce(Communicator& c, CheckLog& log, DType dtype, std::size_t count, int root, ReduceMode mode,
                         uint64_t seed) {
    const std::size_t es = dtype_size(dtype);
    const bool is_root = c.rank() == root, in_place = mode == ReduceMode::InPlace;
    ReductionCase rc = reduction_case(c, dtype, seed, count, 0, count);
    const std::vector<unsigned char> sent = rc.send, untouched(count * es, 0xFF);
    std::vector<unsigned char> recv(count * es, 0xFF);
    void* out = in_place ? rc.send.data() : mode == ReduceMode::NullOnPeers && !is_root ? nullptr : recv.data();
    c.reduce(rc.send.data(), out, count, dtype, root);
    if (in_place) recv = rc.send;
    const std::string what = label("reduce", dtype, count, in_place) + " to root " + std::to_string(root) +
                             (mode == ReduceMode::NullOnPeers ? " (null recv on the others)" : "");
    if (is_root)
        log.expect_same(c, what, recv.data(), rc.want.data(), count, es);
    else if (in_place)
        log.expect_same(c, what + ": a non-root's send changed", recv.data(), sent.data(), count, es);
    else if (mode == ReduceMode::OutOfPlace)
        log.expect_same(c, what + ": a non-root's recv was written", recv.data(), untouched.data(), count, es);
}

inline void check_all_gather(Communicator& c, CheckLog& log, DType dtype, std::size_t count, bool in_place,
                             uint64_t seed) {
    const std::size_t es = dtype_size(dtype), world = static_cast<std::size_t>(c.world());
    const std::size_t block = count * es, mine = static_cast<std::size_t>(c.rank()) * block;
    std::vector<unsigned char> want;
    for (int q = 0; q < c.world(); ++q) {
        const auto b = rank_bytes(seed, q, block);
        want.insert(want.end(), b.begin(), b.end());
    }
    std::vector<unsigned char> recv(world * block, 0xFF);
    const auto send = rank_bytes(seed, c.rank(), block);
    if (in_place) {
        std::copy(send.begin(), send.end(), recv.begin() + static_cast<std::ptrdiff_t>(mine));
        c.all_gather(recv.data() + mine, recv.data(), count, dtype);
    } else {
        c.all_gather(send.data(), recv.data(), count, dtype);
    }
    log.expect_same(c, label("all_gather", dtype, count, in_place), recv.data(), want.data(), world * count, es);
}

inline void check_broadcast(Communicator& c, CheckLog& log, DType dtype, std::size_t count, int root, uint64_t seed) {
    const std::size_t es = dtype_size(dtype);
    auto buffer = rank_bytes(seed, c.rank(), count * es);
    const auto want = rank_bytes(seed, root, count * es);
    c.broadcast(buffer.data(), count, dtype, root);
    log.expect_same(c, label("broadcast", dtype, count, false) + " from root " + std::to_string(root), buffer.data(),
                    want.data(), count, es);
}

// broadcast_string: root's text (empty, short, and longer than any small-buffer size) on every rank,
// whatever the others passed.
inline void check_broadcast_string(Communicator& c, CheckLog& log, int root) {
    for (std::size_t size : {0, 1, 300}) {
        std::string want(size, 'x');
        for (std::size_t i = 0; i < size; ++i) want[i] = static_cast<char>('a' + (i * 7 + root) % 26);
        const std::string mine = c.rank() == root ? want : std::string(c.rank() + 5, '?');
        const std::string got = comm::broadcast_string(c, mine, root);
        ++log.checks;
        if (got != want)
            log.failures.push_back("broadcast_string of " + std::to_string(size) + " bytes from root " +
                                   std::to_string(root) + " on rank " + std::to_string(c.rank()) + ": got '" + got + "'");
    }
}

// Everything: odd counts (not divisible by the world size, smaller than it, and across the summing
// tiles of 2048 elements), both reduction dtypes, in place and not, every root (reduce, broadcast); then the same again
// in a loop, so state left over from one collective would spoil the next.
inline CheckLog check_everything(Communicator& c, uint64_t seed) {
    CheckLog log;
    const DType sums[] = {DType::F32, DType::BF16};
    for (DType dtype : sums)
        for (std::size_t count : {0, 1, 2, 3, 7, 1237, 4099, 10007})
            for (bool in_place : {false, true}) check_all_reduce(c, log, dtype, count, in_place, seed + count);
    for (DType dtype : sums)
        for (std::size_t count : {0, 1, 3, 1001, 2049})
            for (bool in_place : {false, true}) check_reduce_scatter(c, log, dtype, count, in_place, seed + 2 * count);
    for (DType dtype : sums) {
        for (std::size_t count : {0, 1, 2, 3, 7, 1237, 4099})
            for (int root = 0; root < c.world(); ++root)
                for (ReduceMode mode : {ReduceMode::OutOfPlace, ReduceMode::InPlace, ReduceMode::NullOnPeers})
                    check_reduce(c, log, dtype, count, root, mode, seed + 4 * count + root);
        check_reduce(c, log, dtype, 1000003, c.world() - 1, ReduceMode::OutOfPlace, seed + 4);  // many tiles
    }
    for (DType dtype : {DType::F32, DType::BF16, DType::U8})
        for (std::size_t count : {0, 1, 7, 1001})
            for (bool in_place : {false, true}) check_all_gather(c, log, dtype, count, in_place, seed + 3 * count);
    for (int root = 0; root < c.world(); ++root)
        for (DType dtype : {DType::F32, DType::U8})
            for (std::size_t count : {1, 999}) check_broadcast(c, log, dtype, count, root, seed + 5 * count + root);
    for (int root = 0; root < c.world(); ++root) check_broadcast_string(c, log, root);
    c.barrier();
    for (int i = 0; i < 20; ++i) {
        const uint64_t s = seed + 1000 + static_cast<uint64_t>(i);
        check_all_reduce(c, log, DType::F32, 333 + i, i % 2 == 0, s);
        check_reduce_scatter(c, log, DType::BF16, 17 + i, i % 3 == 0, s);
        check_all_gather(c, log, DType::F32, 5 + i, i % 2 == 1, s);
        check_broadcast(c, log, DType::BF16, 9 + i, i % c.world(), s);
        check_reduce(c, log, i % 2 ? DType::F32 : DType::BF16, 41 + i, (i + 1) % c.world(),
                     i % 3 == 0 ? ReduceMode::InPlace : ReduceMode::OutOfPlace, s);
        c.barrier();
    }
    return log;
}

}  // namespace qtrain::test
