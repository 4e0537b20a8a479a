// Times qtrain's causal GQA attention (src/cuda/attention.h), forward and backward, on the shapes of
// the Qwen2.5 models, and prints TFLOP/s counted as PyTorch/FlashAttention count them (forward
// 4*B*Hq*T*T*D / 2 for causal, backward 2.5x forward), so the numbers sit beside bench/attention_sdpa.py.
//
//   attention_bench                     # the default shape list, bf16, both backends (flash, cudnn)
//   attention_bench --flash | --cudnn   # one bf16 backend only
//   attention_bench --fp32              # the fp32 (debug) path instead
//   attention_bench B T Hq Hkv D        # one shape
//   attention_bench --packed=MEAN [...]  # document masking: each shape plain causal, then packed rows of
//                                        # documents of random lengths (exponential, mean MEAN tokens,
//                                        # at least 1, cut at the row end), flash and cuDNN's
//                                        # variable-length path (one ragged sequence per document,
//                                        # cuda/attention_ragged.h; its slots per row: the layout's most
//                                        # documents in a row, or --max-docs=M; its backward in the
//                                        # fewest chunks of rows that keep its workspace under 40 GiB);
//                                        # default shapes: 0.5B and 1.5B at seq 2048 and 4096. TFLOP/s stay counted as plain causal (same work
//                                        # asked of the model), so packed/plain is the tokens/s ratio;
//                                        # "visible" is the packed pairs' share of the causal ones.
//   attention_bench --doc-lengths=FILE [...]  # as --packed, the documents' lengths drawn (uniformly,
//                                        # with replacement) from FILE: whitespace-separated token
//                                        # counts, e.g. a dataset's measured conversation lengths
//
// Each figure is the median of 20 timed runs (CUDA events around each run) after 3 warm-up runs;
// inputs are uniform random in [-2, 2) generated on the device.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/attention.h"
#include "cuda/attention_cudnn.h"
#include "cuda/attention_ragged.h"
#include "cuda/check.h"
#include "core/rng.h"

namespace {

using qtrain::AttentionBackend;
using qtrain::AttentionShape;
using qtrain::DType;

// Element i's uniform value in [-2, 2) (a hash of i and the seed).
__device__ float uniform_pm2(size_t i, uint32_t seed) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return (h >> 8) * (4.0f / 16777216.0f) - 2.0f;
}

__global__ void fill_uniform(void* dst, size_t n, bool bf16, uint32_t seed) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const float x = uniform_pm2(i, seed);
        if (bf16)
            static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16(x);
        else
            static_cast<float*>(dst)[i] = x;
    }
}

void* alloc_random(size_t n, DType dt, uint32_t seed) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, n * qtrain::dtype_size(dt)));
    fill_uniform<<<1024, 256>>>(p, n, dt == DType::BF16, seed);
    CUDA_CHECK(cudaGetLastError());
    return p;
}

template <class F>
float median_ms(F&& f, int warmup = 3, int iters = 20) {
    for (int i = 0; i < warmup; ++i) f();
    std::vector<float> ms(iters);
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < iters; ++i) {
        CUDA_CHECK(cudaEventRecord(a));
        f();
        CUDA_CHECK(cudaEventRecord(b));
        CUDA_CHECK(cudaEventSynchronize(b));
        CUDA_CHECK(cudaEventElapsedTime(&ms[i], a, b));
    }
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[iters / 2];
}

// Where packed documents' lengths come from: exponential with mean `mean`, or drawn from `lengths`.
struct DocLengths {
    double mean = 0;
    std::vector<int> lengths;
    bool on() const { return mean > 0 || !lengths.empty(); }
    int draw(qtrain::Rng& r) const {
        if (!lengths.empty()) return lengths[r.below(lengths.size())];
        const double u = std::max(1e-12, 1.0 - r.uniform());
        return std::max(1, static_cast<int>(std::lround(-mean * std::log(u))));
    }
};

std::vector<int> read_lengths(const char* path) {
    std::ifstream f(path);
    QT_CHECK(f, "--doc-lengths=", path, ": cannot open the file");
    std::vector<int> v;
    long long x = 0;
    while (f >> x) {
        QT_CHECK(x >= 1 && x <= (1 << 30), "--doc-lengths=", path, ": length ", x, " (entry ", v.size() + 1,
                 ") is not a positive token count");
        v.push_back(static_cast<int>(x));
    }
    QT_CHECK(f.eof(), "--doc-lengths=", path, ": entry ", v.size() + 1, " is not a number");
    QT_CHECK(!v.empty(), "--doc-lengths=", path, ": no lengths in the file");
    return v;
}

// Batch::positions of B rows packed with documents of the given lengths (each cut at its row's
// end), and the share of the causal (query, key) pairs that stay visible.
std::vector<int32_t> packed_positions(const AttentionShape& s, const DocLengths& docs, uint64_t seed,
                                      double* visible) {
    qtrain::Rng r(seed);
    std::vector<int32_t> pos;
    double pairs = 0;
    for (int b = 0; b < s.B; ++b) {
        int t = 0;
        while (t < s.T) {
            const int len = std::min(s.T - t, docs.draw(r));
            for (int p = 0; p < len; ++p) pos.push_back(p);
            pairs += 0.5 * len * (len + 1.0);
            t += len;
        }
    }
    *visible = pairs / (s.B * 0.5 * s.T * (s.T + 1.0));
    return pos;
}

// max_docs (cuDNN packed only): the ragged batch's slots per row; 0 = the layout's most documents in a row.
void bench(AttentionShape s, DType dt, AttentionBackend be, const DocLengths* docs = nullptr, int max_docs = 0) {
    int32_t* positions = nullptr;
    double visible = 1;
    int most_docs = 0;
    if (docs) {
        const std::vector<int32_t> pos = packed_positions(s, *docs, 1234, &visible);
        most_docs = qtrain::cuda::max_documents_per_row(pos.data(), s.B, s.T);
        if (be == AttentionBackend::Cudnn) {
            s.max_docs = max_docs > 0 ? max_docs : most_docs;
            QT_CHECK(most_docs <= s.max_docs, "--max-docs=", max_docs, ": a row holds ", most_docs, " documents");
        }
        CUDA_CHECK(cudaMalloc(&positions, pos.size() * sizeof(int32_t)));
        CUDA_CHECK(cudaMemcpy(positions, pos.data(), pos.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    }
    const size_t n_tok = static_cast<size_t>(s.B) * s.T;
    const size_t n_qkv = n_tok * (s.Hq + 2 * s.Hkv) * s.D, n_out = n_tok * s.Hq * s.D;
    void* qkv = alloc_random(n_qkv, dt, 1);
    void* dout = alloc_random(n_out, dt, 2);
    void *out = nullptr, *dqkv = nullptr, *ws = nullptr;
    float* lse = nullptr;
    CUDA_CHECK(cudaMalloc(&out, n_out * qtrain::dtype_size(dt)));
    CUDA_CHECK(cudaMalloc(&dqkv, n_qkv * qtrain::dtype_size(dt)));
    CUDA_CHECK(cudaMalloc(&lse, static_cast<size_t>(s.B) * s.Hq * s.T * sizeof(float)));
    // cuDNN packed: its deterministic backward's workspace grows with the slots (B x max_docs sequences of
    // T); the backward runs in the fewest chunks of rows (as --attn-bwd-chunks) that keep it under 40 GiB
    int chunks = 1;
    size_t ws_bytes = qtrain::attention_backward_workspace_bytes(dt, s, 1, be);
    while (s.max_docs > 0 && ws_bytes > (size_t{40} << 30) && chunks < s.B) {
        do ++chunks;
        while (s.B % chunks != 0);
        ws_bytes = qtrain::attention_backward_workspace_bytes(dt, s, chunks, be);
    }
    CUDA_CHECK(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 256)));

    const float fwd_ms =
        median_ms([&] { qtrain::attention_forward(dt, out, lse, qkv, s, nullptr, nullptr, be, ws, positions); });
    const float bwd_ms = median_ms(
        [&] { qtrain::attention_backward(dt, dqkv, dout, qkv, out, lse, ws, s, nullptr, chunks, be, positions); });
    CUDA_CHECK(cudaDeviceSynchronize());

    const double fwd_flops = 4.0 * s.B * s.Hq * static_cast<double>(s.T) * s.T * s.D / 2.0;
    const double bwd_flops = 2.5 * fwd_flops;
    const std::string label = std::string(dt != DType::BF16                   ? "fp32"
                                          : be == AttentionBackend::Cudnn ? "bf16-cudnn"
                                                                          : "bf16-flash") +
                              (positions ? "-packed" : "");
    if (positions) {
        if (docs->lengths.empty())
            std::printf("            (packed: documents of mean %.0f tokens, %.1f%% of the causal pairs visible)\n",
                        docs->mean, 100.0 * visible);
        else
            std::printf("            (packed: documents drawn from %zu lengths, %.1f%% of the causal pairs visible)\n",
                        docs->lengths.size(), 100.0 * visible);
        std::printf("            (at most %d documents in a row%s)\n", most_docs,
                    s.max_docs > 0 ? qtrain::cat("; cuDNN ragged batch of ", s.B, " x ", s.max_docs,
                                                 " sequences, backward in ", chunks, " chunk(s) of rows")
                                         .c_str()
                                   : "");
    }
    std::printf("%-18s B=%-3d T=%-5d Hq=%-3d Hkv=%-2d D=%-4d | fwd %8.3f ms %7.1f TFLOP/s | bwd %8.3f ms %7.1f TFLOP/s"
                " | fwd+bwd %7.1f TFLOP/s | bwd workspace %.1f MiB\n",
                label.c_str(), s.B, s.T, s.Hq, s.Hkv, s.D, fwd_ms, fwd_flops / fwd_ms * 1e-9,
                bwd_ms, bwd_flops / bwd_ms * 1e-9, (fwd_flops + bwd_flops) / (fwd_ms + bwd_ms) * 1e-9,
                ws_bytes / 1048576.0);
    if (be == AttentionBackend::Cudnn && !positions)  // what --plan-only assumes without a GPU
        std::printf("            (workspace estimate without a GPU: %.1f MiB)\n",
                    qtrain::detail::cudnn_attention_backward_workspace_estimate(s) / 1048576.0);
    std::fflush(stdout);
    for (void* p : {qkv, dout, out, dqkv, ws, static_cast<void*>(lse), static_cast<void*>(positions)})
        CUDA_CHECK(cudaFree(p));
}

}  // namespace

int main(int argc, char** argv) {
    try {
        DType dt = DType::BF16;
        std::vector<AttentionBackend> backends{AttentionBackend::Flash, AttentionBackend::Cudnn};
        std::vector<int> nums;
        DocLengths docs;
        int max_docs = 0;
        for (int i = 1; i < argc; ++i) {
            if (std::strncmp(argv[i], "--packed=", 9) == 0) {
                docs.mean = std::atof(argv[i] + 9);
                QT_CHECK(docs.mean >= 1, "--packed=", argv[i] + 9, ": the mean document length must be >= 1");
            } else if (std::strncmp(argv[i], "--doc-lengths=", 14) == 0) {
                docs.lengths = read_lengths(argv[i] + 14);
            } else if (std::strncmp(argv[i], "--max-docs=", 11) == 0) {
                max_docs = std::atoi(argv[i] + 11);
                QT_CHECK(max_docs >= 1, "--max-docs=", argv[i] + 11, ": must be >= 1");
            } else if (std::strcmp(argv[i], "--fp32") == 0)
                dt = DType::F32;
            else if (std::strcmp(argv[i], "--flash") == 0)
                backends = {AttentionBackend::Flash};
            else if (std::strcmp(argv[i], "--cudnn") == 0)
                backends = {AttentionBackend::Cudnn};
            else
                nums.push_back(std::atoi(argv[i]));
        }
        std::vector<AttentionShape> shapes;
        if (nums.size() == 5) {
            shapes.push_back({nums[0], nums[1], nums[2], nums[3], nums[4]});
        } else if (nums.empty() && docs.on()) {
            shapes = {
                {8, 2048, 14, 2, 64},    // Qwen2.5-0.5B at seq 2048
                {4, 4096, 14, 2, 64},    // 0.5B at seq 4096
                {8, 2048, 12, 2, 128},   // Qwen2.5-1.5B at seq 2048
                {4, 4096, 12, 2, 128},   // 1.5B at seq 4096
            };
        } else if (nums.empty()) {
            shapes = {
                {32, 1024, 14, 2, 64},   // Qwen2.5-0.5B, batch 32
                {16, 1024, 12, 2, 128},  // Qwen2.5-1.5B, batch 16
                {8, 2048, 12, 2, 128},   // 1.5B at seq 2048
                {4, 1024, 28, 4, 128},   // Qwen2.5-7B, batch 4
            };
        } else {
            std::fprintf(stderr,
                         "usage: %s [--fp32 | --flash | --cudnn] [--packed=MEAN | --doc-lengths=FILE] [--max-docs=M] "
                         "[B T Hq Hkv D]\n",
                         argv[0]);
            return 2;
        }
        cudaDeviceProp prop{};
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        const std::string cudnn = qtrain::detail::cudnn_runtime_version();
        std::printf("# %s, %d SMs%s\n", prop.name, prop.multiProcessorCount,
                    cudnn.empty() ? "" : (", cuDNN " + cudnn + " loaded").c_str());
        if (dt == DType::F32) backends = {AttentionBackend::Flash};
        std::string why;
        if (!qtrain::attention_backend_available(AttentionBackend::Cudnn, &why)) {
            std::printf("# no cuDNN backend: %s\n", why.c_str());
            std::erase(backends, AttentionBackend::Cudnn);
        }
        for (const auto& s : shapes)
            for (AttentionBackend be : backends) {
                bench(s, dt, be);
                if (docs.on()) bench(s, dt, be, &docs, max_docs);
            }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
