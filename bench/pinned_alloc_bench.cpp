// How fast can pinned host memory be had? A 14B run pins 110 GiB and its set-up spent ~61 s in
// allocation (docs/perf-notes.md, 2026-12-01): cudaHostAlloc pins 4 KiB pages one by one. This
// times, for one size, the ways the model could get the same mapped, pinned memory:
//   A  cudaHostAlloc(mapped)                                     (what gpu model does today)
//   B  mmap + madvise(MADV_HUGEPAGE) + cudaHostRegister(mapped)  (2 MiB pages, if THP allows)
//   C  as B, with the pages first touched by all cores
//   D  cudaHostAlloc(mapped) from several threads at once, size / threads each
// and the host-to-device copy rate from A's and C's memory (pinning 2 MiB pages must not cost
// transfer speed). usage: pinned_alloc_bench [GiB, default 8] [threads for C and D, default 16]
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

namespace {

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        std::exit(1);
    }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// GiB/s of cudaMemcpyAsync from host memory h to a device buffer, 4 copies of `bytes`.
double h2d_rate(const void* h, void* d, std::size_t bytes) {
    cudaStream_t s;
    check(cudaStreamCreate(&s), "cudaStreamCreate");
    check(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s), "warm-up copy");
    check(cudaStreamSynchronize(s), "sync");
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 4; ++i) check(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s), "copy");
    check(cudaStreamSynchronize(s), "sync");
    const double rate = 4.0 * static_cast<double>(bytes) / seconds_since(t0) / (1ull << 30);
    cudaStreamDestroy(s);
    return rate;
}

void* map_huge(std::size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        std::perror("mmap");
        std::exit(1);
    }
    if (madvise(p, bytes, MADV_HUGEPAGE) != 0) std::perror("madvise(MADV_HUGEPAGE)");
    return p;
}

void touch_in_parallel(void* p, std::size_t bytes, int threads) {
    std::vector<std::thread> pool;
    const std::size_t part = (bytes + threads - 1) / threads;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([=] {
            const std::size_t b = t * part;
            if (b < bytes) std::memset(static_cast<char*>(p) + b, 0, std::min(part, bytes - b));
        });
    for (auto& th : pool) th.join();
}

}  // namespace

int main(int argc, char** argv) {
    const double gib = argc > 1 ? std::atof(argv[1]) : 8.0;
    const int threads = argc > 2 ? std::atoi(argv[2]) : 16;
    const std::size_t bytes = static_cast<std::size_t>(gib * (1ull << 30));
    check(cudaFree(nullptr), "context");
    {
        std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
        std::string mode;
        std::getline(thp, mode);
        std::printf("transparent hugepages: %s\n", mode.c_str());
    }
    void* d = nullptr;
    const std::size_t copy_bytes = std::min<std::size_t>(bytes, 1ull << 30);
    check(cudaMalloc(&d, copy_bytes), "cudaMalloc");

    auto t0 = std::chrono::steady_clock::now();
    void* a = nullptr;
    check(cudaHostAlloc(&a, bytes, cudaHostAllocMapped), "A cudaHostAlloc");
    const double ta = seconds_since(t0);
    std::printf("A cudaHostAlloc:                         %6.2f s  (%5.2f GiB/s), h2d %5.1f GiB/s\n", ta, gib / ta,
                h2d_rate(a, d, copy_bytes));
    check(cudaFreeHost(a), "cudaFreeHost");

    t0 = std::chrono::steady_clock::now();
    void* b = map_huge(bytes);
    check(cudaHostRegister(b, bytes, cudaHostRegisterMapped), "B cudaHostRegister");
    const double tb = seconds_since(t0);
    std::printf("B mmap + MADV_HUGEPAGE + register:       %6.2f s  (%5.2f GiB/s)\n", tb, gib / tb);
    cudaHostUnregister(b);
    munmap(b, bytes);

    t0 = std::chrono::steady_clock::now();
    void* c = map_huge(bytes);
    touch_in_parallel(c, bytes, threads);
    const double touched = seconds_since(t0);
    check(cudaHostRegister(c, bytes, cudaHostRegisterMapped), "C cudaHostRegister");
    const double tc = seconds_since(t0);
    std::printf("C as B, touched by %2d threads first:     %6.2f s  (%5.2f GiB/s; touch %.2f s), h2d %5.1f GiB/s\n",
                threads, tc, gib / tc, touched, h2d_rate(c, d, copy_bytes));
    cudaHostUnregister(c);
    munmap(c, bytes);

    t0 = std::chrono::steady_clock::now();
    std::vector<void*> parts(threads, nullptr);
    {
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t)
            pool.emplace_back([&, t] {
                check(cudaHostAlloc(&parts[t], bytes / threads, cudaHostAllocMapped), "D cudaHostAlloc");
            });
        for (auto& th : pool) th.join();
    }
    const double td = seconds_since(t0);
    std::printf("D cudaHostAlloc from %2d threads:         %6.2f s  (%5.2f GiB/s)\n", threads, td, gib / td);
    for (void* p : parts) cudaFreeHost(p);
    cudaFree(d);
    return 0;
}
