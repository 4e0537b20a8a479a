// The copy-engine communicator's all_gather and reduce_scatter bandwidth, 2 ranks (threads) on one
// GPU, at bucket sizes of 1 to 256 MiB in fp32 and bf16, against one plain cudaMemcpyAsync of the same
// bytes on one stream. The bucket is the gathered buffer (all_gather's recv) or the scattered one
// (reduce_scatter's send); each rank moves half of it from its peer (all_gather in place, as ZeRO
// gathers; reduce_scatter then sums it with its own half). Both ranks share the GPU's memory here, so this measures the protocol's and the
// kernel's cost on top of the copies, not NVLink.
//   comm_bench [iterations=20]
// One line per size: ms per collective, GB/s of the bytes each rank moves, memcpy's GB/s for them,
// and the ratio (1.0: as fast as the copy alone).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/cuda/copy_engine_communicator.h"
#include "comm/run_ranks.h"
#include "core/error.h"

namespace {

using qtrain::DType;
using qtrain::comm::Communicator;

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw qtrain::Error(std::string(what) + ": " + cudaGetErrorString(e));
}

constexpr int kWarmup = 3;

// Milliseconds per call of fn (queued `iters` times on `s`), timed with CUDA events.
template <class F>
float time_ms(cudaStream_t s, int iters, F fn) {
    for (int i = 0; i < kWarmup; ++i) fn();
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    check(cudaEventRecord(start, s), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) fn();
    check(cudaEventRecord(stop, s), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return ms / static_cast<float>(iters);
}

}  // namespace

int main(int argc, char** argv) {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::fprintf(stderr, "comm_bench: no CUDA device\n");
        return 1;
    }
    const std::size_t sizes_mib[] = {1, 4, 16, 64, 256};
    const std::size_t max_bucket = std::size_t{256} << 20;
    std::printf("copy-engine communicator, 2 ranks on device 0, %d iterations after %d warm-ups\n", iters, kWarmup);
    try {
        qtrain::comm::ThreadWorld world(2);
        qtrain::comm::run_ranks(
            world,
            [](qtrain::comm::ThreadWorld& w, int rank) -> std::unique_ptr<Communicator> {
                return qtrain::comm::make_copy_engine_communicator(w, rank, 0);
            },
            [&](Communicator& c) {
                check(cudaSetDevice(0), "cudaSetDevice");
                auto& ce = dynamic_cast<qtrain::comm::CopyEngineCommunicator&>(c);
                cudaStream_t s;
                check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
                void *send = nullptr, *recv = nullptr, *copy = nullptr;
                check(cudaMalloc(&send, max_bucket), "cudaMalloc");
                check(cudaMalloc(&recv, max_bucket), "cudaMalloc");
                check(cudaMalloc(&copy, max_bucket / 2), "cudaMalloc");
                check(cudaMemset(send, 0, max_bucket), "cudaMemset");
                check(cudaMemset(recv, 0, max_bucket), "cudaMemset");
                check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
                ce.reserve(qtrain::comm::CopyEngineCommunicator::staging_bytes_for(0, max_bucket / 2 / 2, DType::BF16, 2,
                                                                                    c.rank()));
                for (const char* op : {"all_gather", "reduce_scatter"})
                    for (DType dtype : {DType::F32, DType::BF16})
                        for (std::size_t mib : sizes_mib) {
                            const std::size_t bucket = mib << 20, moved = bucket / 2;
                            const std::size_t per_rank = moved / qtrain::dtype_size(dtype);  // elements of a block
                            c.barrier();
                            const float ms = time_ms(s, iters, [&] {
                                if (op[0] == 'a')  // in place, as ZeRO gathers: block r of recv is the send
                                    c.all_gather(static_cast<char*>(recv) + c.rank() * moved, recv, per_rank, dtype, s);
                                else
                                    c.reduce_scatter(send, recv, per_rank, dtype, s);
                            });
                            c.barrier();  // rank 1 idles while rank 0 times the plain copy alone
                            if (c.rank() != 0) continue;
                            const float copy_ms = time_ms(s, iters, [&] {
                                check(cudaMemcpyAsync(copy, send, moved, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
                            });
                            const double gbs = moved / (ms * 1e6), copy_gbs = moved / (copy_ms * 1e6);
                            std::printf("%-14s %-4s %4zu MiB: %8.3f ms  %7.1f GB/s  memcpy %7.1f GB/s  ratio %.2f\n", op,
                                        std::string(qtrain::dtype_name(dtype)).c_str(), mib, ms, gbs, copy_gbs, gbs / copy_gbs);
                            std::fflush(stdout);
                        }
                c.barrier();
                check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
                cudaFree(send);
                cudaFree(recv);
                cudaFree(copy);
                cudaStreamDestroy(s);
            });
    } catch (const std::exception& e) {
        std::fprintf(stderr, "comm_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
