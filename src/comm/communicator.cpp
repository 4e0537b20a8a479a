#include "comm/communicator.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"

namespace qtrain::comm {
namespace {

// The message prefix naming where a bad call came from.
std::string where(const Communicator& c, const char* op) {
    return cat(op, " (", c.backend(), " communicator, rank ", c.rank(), " of ", c.world(), "): ");
}

void check_reduction_dtype(const Communicator& c, const char* op, DType dtype) {
    QT_CHECK(dtype == DType::F32 || dtype == DType::BF16, where(c, op), "sums are implemented for fp32 and bf16, got ",
             dtype_name(dtype));
}

void check_stream(const Communicator& c, const char* op, void* stream, bool uses_stream) {
    QT_CHECK(uses_stream || stream == nullptr, where(c, op),
             "this backend works on host memory and completes before returning; it takes no stream "
             "(pass nullptr)");
}

void check_pointer(const Communicator& c, const char* op, const void* p, std::size_t count, const char* which) {
    QT_CHECK(count == 0 || p != nullptr, where(c, op), which, " is null for a count of ", count);
}

// count * factor elements of `dtype` as bytes, or an error when that overflows.
std::size_t bytes_of(const Communicator& c, const char* op, std::size_t count, std::size_t factor, DType dtype) {
    const std::size_t limit = std::numeric_limits<std::size_t>::max() / dtype_size(dtype) / factor;
    QT_CHECK(count <= limit, where(c, op), "count ", count, " times ", factor, " overflows a byte size");
    return count * factor * dtype_size(dtype);
}

void check_root(const Communicator& c, const char* op, int root) {
    QT_CHECK(root >= 0 && root < c.world(), where(c, op), "root ", root, " is not a rank (world size ", c.world(), ")");
}

bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
    const auto x = reinterpret_cast<std::uintptr_t>(a);
    const auto y = reinterpret_cast<std::uintptr_t>(b);
    return a_bytes && b_bytes && x < y + b_bytes && y < x + a_bytes;
}

// `small` (small_bytes) may sit exactly at `big + offset` (the in-place position) or apart from big;
// any other overlap would let a rank overwrite data a peer (or the backend) still reads.
void check_in_place(const Communicator& c, const char* op, const void* big, std::size_t big_bytes, const void* small,
                    std::size_t small_bytes, std::size_t offset, const char* rule) {
    if (!overlap(big, big_bytes, small, small_bytes)) return;
    const bool in_place = reinterpret_cast<std::uintptr_t>(small) == reinterpret_cast<std::uintptr_t>(big) + offset;
    QT_CHECK(in_place, where(c, op), "send and recv overlap; the only overlap allowed is in place, ", rule);
}

}  // namespace

void Communicator::all_reduce(const void* send, void* recv, std::size_t count, DType dtype, void* stream) {
    const char* op = "all_reduce";
    check_reduction_dtype(*this, op, dtype);
    check_stream(*this, op, stream, uses_stream());
    check_pointer(*this, op, send, count, "send");
    check_pointer(*this, op, recv, count, "recv");
    const std::size_t bytes = bytes_of(*this, op, count, 1, dtype);
    check_in_place(*this, op, send, bytes, recv, bytes, 0, "recv == send");
    do_all_reduce(send, recv, count, dtype, stream);
}

void Communicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, void* stream) {
    const char* op = "reduce_scatter";
    check_reduction_dtype(*this, op, dtype);
    check_stream(*this, op, stream, uses_stream());
    check_pointer(*this, op, send, recv_count, "send");
    check_pointer(*this, op, recv, recv_count, "recv");
    const std::size_t block = bytes_of(*this, op, recv_count, 1, dtype);
    const std::size_t all = bytes_of(*this, op, recv_count, static_cast<std::size_t>(world()), dtype);
    check_in_place(*this, op, send, all, recv, block, block * static_cast<std::size_t>(rank()),
                   "recv == send + rank * recv_count");
    do_reduce_scatter(send, recv, recv_count, dtype, stream);
}

void Communicator::reduce(const void* send, void* recv, std::size_t count, DType dtype, int root, void* stream) {
    const char* op = "reduce";
    check_reduction_dtype(*this, op, dtype);
    check_stream(*this, op, stream, uses_stream());
    check_root(*this, op, root);
    check_pointer(*this, op, send, count, "send");
    const std::size_t bytes = bytes_of(*this, op, count, 1, dtype);
    if (rank() == root) {  // only the root's recv is used
        check_pointer(*this, op, recv, count, "recv");
        check_in_place(*this, op, send, bytes, recv, bytes, 0, "recv == send (on the root)");
    }
    do_reduce(send, recv, count, dtype, root, stream);
}

void Communicator::all_gather(const void* send, void* recv, std::size_t send_count, DType dtype, void* stream) {
    const char* op = "all_gather";
    check_stream(*this, op, stream, uses_stream());
    check_pointer(*this, op, send, send_count, "send");
    check_pointer(*this, op, recv, send_count, "recv");
    const std::size_t block = bytes_of(*this, op, send_count, 1, dtype);
    const std::size_t all = bytes_of(*this, op, send_count, static_cast<std::size_t>(world()), dtype);
    check_in_place(*this, op, recv, all, send, block, block * static_cast<std::size_t>(rank()),
                   "send == recv + rank * send_count");
    do_all_gather(send, recv, send_count, dtype, stream);
}

void Communicator::broadcast(void* buffer, std::size_t count, DType dtype, int root, void* stream) {
    const char* op = "broadcast";
    check_stream(*this, op, stream, uses_stream());
    check_pointer(*this, op, buffer, count, "buffer");
    check_root(*this, op, root);
    bytes_of(*this, op, count, 1, dtype);
    do_broadcast(buffer, count, dtype, root, stream);
}

void Communicator::barrier() { do_barrier(); }

void sum_scalars_over_ranks(Communicator& comm, const double* values, double* sums, int n) {
    QT_CHECK(n >= 0, "sum_scalars_over_ranks: negative count ", n);
    std::vector<double> all(static_cast<std::size_t>(n) * static_cast<std::size_t>(comm.world()));
    // a double is two 4-byte elements to the byte-moving all_gather
    comm.all_gather(values, all.data(), 2 * static_cast<std::size_t>(n), DType::F32);
    for (int i = 0; i < n; ++i) {
        double s = 0.0;
        for (int r = 0; r < comm.world(); ++r) s += all[static_cast<std::size_t>(r) * n + i];
        sums[i] = s;
    }
}

std::string broadcast_string(Communicator& comm, const std::string& value, int root) {
    // the length first, so every rank can size its buffer; then the bytes (none for an empty string)
    uint64_t size = comm.rank() == root ? value.size() : 0;
    comm.broadcast(&size, sizeof size, DType::U8, root);
    std::string out = comm.rank() == root ? value : std::string(size, '\0');
    if (size) comm.broadcast(out.data(), size, DType::U8, root);
    return out;
}

std::vector<std::byte> broadcast_bytes(Communicator& comm, const std::vector<std::byte>& value, int root) {
    uint64_t size = comm.rank() == root ? value.size() : 0;
    comm.broadcast(&size, sizeof size, DType::U8, root);
    std::vector<std::byte> out = comm.rank() == root ? value : std::vector<std::byte>(size);
    if (size) comm.broadcast(out.data(), size, DType::U8, root);
    return out;
}

}  // namespace qtrain::comm
