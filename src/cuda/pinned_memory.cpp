#include "cuda/pinned_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "core/error.h"
#include "cuda/check.h"

namespace qtrain::cuda {

namespace {

// Below this, cudaHostAlloc's cost does not matter and huge pages would waste memory.
constexpr std::size_t kRegisterMinBytes = 64ull << 20;

// Faults every page in from all cores (what cudaHostRegister would otherwise do on one).
void touch_in_parallel(void* p, std::size_t bytes) {
    const unsigned threads = std::max(1u, std::min(64u, std::thread::hardware_concurrency()));
    const std::size_t part = (bytes / threads + 4095) / 4096 * 4096;
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) {
        const std::size_t begin = t * part;
        if (begin >= bytes) break;
        pool.emplace_back([=] { std::memset(static_cast<char*>(p) + begin, 0, std::min(part, bytes - begin)); });
    }
    for (auto& th : pool) th.join();
}

void* map_and_register(std::size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    madvise(p, bytes, MADV_HUGEPAGE);  // best effort: without THP it is 4 KiB pages, still registered
    // as CUDA does for its own pinned memory: a fork (a Python data loader, say) must not copy or
    // share 100 GiB of pinned pages
    madvise(p, bytes, MADV_DONTFORK);
    touch_in_parallel(p, bytes);
    if (cudaHostRegister(p, bytes, cudaHostRegisterMapped) != cudaSuccess) {
        cudaGetLastError();  // reset the last-error state (the caller falls back to cudaHostAlloc)
        munmap(p, bytes);
        return nullptr;
    }
    return p;
}

}  // namespace

PinnedBlock pinned_alloc(std::size_t bytes, bool write_combined, const char* what) {
    PinnedBlock b;
    b.bytes = bytes;
    if (!write_combined && bytes >= kRegisterMinBytes) {
        b.ptr = map_and_register(bytes);
        b.registered = b.ptr != nullptr;
    }
    if (!b.ptr) {
        const cudaError_t e =
            cudaHostAlloc(&b.ptr, bytes, cudaHostAllocMapped | (write_combined ? cudaHostAllocWriteCombined : 0));
        QT_CHECK(e == cudaSuccess, "cannot pin ", bytes, " bytes of host memory for ", what, ": ",
                 cudaGetErrorString(e), " (see --host-memory-limit and the plan's pinned column)");
    }
    void* dev = nullptr;
    CUDA_CHECK(cudaHostGetDevicePointer(&dev, b.ptr, 0));
    QT_CHECK(dev == b.ptr, "pinned host memory of ", what,
             " is not mapped at the same address on the GPU (unified addressing is required)");
    return b;
}

void pinned_free(PinnedBlock& b) {
    if (!b.ptr) return;
    if (b.registered) {
        cudaHostUnregister(b.ptr);
        munmap(b.ptr, b.bytes);
    } else {
        cudaFreeHost(b.ptr);
    }
    b = PinnedBlock{};
}

}  // namespace qtrain::cuda
