// Pinned, device-mapped host memory for the offloaded and streamed buffers (one block per arena).
// Plain C++ over the CUDA runtime, so callers need no CUDA headers.
//
// cudaHostAlloc pins 4 KiB pages one at a time: ~1.4 GiB/s on the H200 machine, so a 14B run's
// 110 GiB took a minute. Large blocks are instead mapped anonymously with transparent huge pages
// requested (MADV_HUGEPAGE), faulted in by all cores, then registered (cudaHostRegister, mapped):
// ~16 GiB/s there, with the same host-to-device copy rate (bench/pinned_alloc_bench.cpp,
// docs/perf-notes.md). Write-combined memory (--write-combined) has no registration flag, so it
// keeps cudaHostAlloc, as do small blocks and any block whose registration fails.
#pragma once

#include <cstddef>

namespace qtrain::cuda {

struct PinnedBlock {
    void* ptr = nullptr;
    std::size_t bytes = 0;
    bool registered = false;  // mmap + cudaHostRegister (else cudaHostAlloc)
};

// Pinned host memory (contents unspecified: the model zeroes what it keeps), mapped at the same
// address on the device (unified addressing; checked). Throws qtrain::Error naming `what` when it
// cannot be had.
PinnedBlock pinned_alloc(std::size_t bytes, bool write_combined, const char* what);
void pinned_free(PinnedBlock& block);  // no-op on an empty block; leaves it empty

}  // namespace qtrain::cuda
