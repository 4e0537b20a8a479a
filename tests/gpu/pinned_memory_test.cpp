// cuda::pinned_alloc, the pinned host memory of offloaded and streamed buffers: every way it can
// allocate (registered huge-page mmap for large blocks, cudaHostAlloc for small or write-combined
// ones) gives memory the GPU reads and writes at the host address, both directions by copy and by
// a kernel (zero-copy), and frees cleanly.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/pinned_memory.h"
#include "gpu_test_util.h"

using namespace qtrain;

TEST(PinnedMemory, EveryWayIsMappedAtTheHostAddressAndFreesCleanly) {
    QTRAIN_REQUIRE_GPU();
    struct Case {
        const char* name;
        std::size_t bytes;
        bool write_combined, registered;
    };
    for (const Case& c : {Case{"large: registered mmap", 96ull << 20, false, true},
                          Case{"small: cudaHostAlloc", 1ull << 20, false, false},
                          Case{"write-combined: cudaHostAlloc", 96ull << 20, true, false}}) {
        SCOPED_TRACE(c.name);
        cuda::PinnedBlock b = cuda::pinned_alloc(c.bytes, c.write_combined, c.name);
        ASSERT_NE(b.ptr, nullptr);
        EXPECT_EQ(b.registered, c.registered);
        EXPECT_EQ(b.bytes, c.bytes);
        auto* host = static_cast<uint8_t*>(b.ptr);
        // host writes, device reads (copy engine)
        for (std::size_t i = 0; i < c.bytes; i += 4096) host[i] = static_cast<uint8_t>(i / 4096 * 7 + 1);
        std::vector<uint8_t> back(c.bytes);
        void* dev = nullptr;
        CUDA_CHECK(cudaMalloc(&dev, c.bytes));
        CUDA_CHECK(cudaMemcpy(dev, b.ptr, c.bytes, cudaMemcpyDefault));
        CUDA_CHECK(cudaMemcpy(back.data(), dev, c.bytes, cudaMemcpyDeviceToHost));
        EXPECT_EQ(std::memcmp(back.data(), host, c.bytes), 0);
        // a kernel writes the host address directly (zero-copy, as the optimizer does)
        cuda::fill_zero(b.ptr, c.bytes, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::size_t nonzero = 0;
        for (std::size_t i = 0; i < c.bytes; ++i) nonzero += host[i] != 0;
        EXPECT_EQ(nonzero, 0u);
        CUDA_CHECK(cudaFree(dev));
        cuda::pinned_free(b);
        EXPECT_EQ(b.ptr, nullptr);
        cuda::pinned_free(b);  // freeing an empty block is a no-op
    }
}
