// Ragged (one sequence per document) index for cuDNN's variable-length SDPA; see attention_ragged.h.
#include "cuda/attention_ragged.h"

#include <algorithm>

#include "core/error.h"
#include "cuda/check.h"

namespace qtrain::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps

std::size_t entries(int B, int max_docs) {
    // B*M slots plus one end entry per group; at most B groups
    return static_cast<std::size_t>(B) * max_docs + B;
}

std::size_t round256(std::size_t x) { return (x + 255) / 256 * 256; }

// One block per row. Pass 1 finds the row's document starts (positions == 0) in order, with a
// block-wide count per chunk of kThreads tokens; pass 2 writes the row's max_docs slots.
__global__ void ragged_index_kernel(RaggedIndex idx, const int32_t* __restrict__ positions, int T, int max_docs,
                                    int rows_per_group, int64_t qkv_cols, int64_t o_cols, int64_t lse_cols) {
    extern __shared__ int starts[];  // max_docs
    __shared__ int warp_count[kThreads / 32];
    __shared__ int total, shortest;
    const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t* pos = positions + static_cast<int64_t>(b) * T;
    if (tid == 0) total = 0;
    __syncthreads();
    for (int base = 0; base < T; base += kThreads) {
        const int t = base + tid;
        const bool start = t < T && pos[t] == 0;
        const unsigned ballot = __ballot_sync(0xffffffffu, start);
        if (lane == 0) warp_count[warp] = __popc(ballot);
        __syncthreads();
        int before = total;
        for (int w = 0; w < warp; ++w) before += warp_count[w];
        const int k = before + __popc(ballot & ((1u << lane) - 1u));
        if (start && k < max_docs) starts[k] = t;
        __syncthreads();
        if (tid == 0)
            for (int w = 0; w < kThreads / 32; ++w) total += warp_count[w];
        __syncthreads();
    }
    const int n = min(total, max_docs);  // >= 1: a row starts with position 0 (checked by the caller)
    auto doc_len = [&](int j) { return (j + 1 < n ? starts[j + 1] : T) - starts[j]; };
    if (tid == 0) {  // the shortest document; the first of equals, so the choice is deterministic
        int best = 0;
        for (int j = 1; j < n; ++j)
            if (doc_len(j) < doc_len(best)) best = j;
        shortest = best;
    }
    __syncthreads();
    const int pad = max_docs - n, g = b / rows_per_group, r = b % rows_per_group;
    const int64_t group_base = static_cast<int64_t>(g) * (static_cast<int64_t>(rows_per_group) * max_docs + 1);
    for (int s = tid; s < max_docs; s += kThreads) {
        // slots 0..shortest: documents 0..shortest; then pad copies of the shortest; then the rest
        const int j = s <= shortest ? s : s <= shortest + pad ? shortest : s - pad;
        const int64_t token = static_cast<int64_t>(r) * T + starts[j];
        const int64_t e = group_base + static_cast<int64_t>(r) * max_docs + s;
        idx.qkv_off[e] = token * qkv_cols;
        idx.o_off[e] = token * o_cols;
        idx.lse_off[e] = token * lse_cols;
        idx.seq_len[e] = doc_len(j);
    }
    if (tid == 0 && r == rows_per_group - 1) {  // the group's end entry
        const int64_t token = static_cast<int64_t>(rows_per_group) * T;
        const int64_t e = group_base + static_cast<int64_t>(rows_per_group) * max_docs;
        idx.qkv_off[e] = token * qkv_cols;
        idx.o_off[e] = token * o_cols;
        idx.lse_off[e] = token * lse_cols;
        idx.seq_len[e] = 0;
    }
}

}  // namespace

std::size_t ragged_index_bytes(int B, int max_docs) {
    const std::size_t e = entries(B, max_docs);
    return 3 * round256(e * sizeof(int64_t)) + round256(e * sizeof(int32_t));
}

RaggedIndex ragged_index_at(void* memory, int B, int max_docs) {
    const std::size_t e = entries(B, max_docs), step = round256(e * sizeof(int64_t));
    char* p = static_cast<char*>(memory);
    return {reinterpret_cast<int64_t*>(p), reinterpret_cast<int64_t*>(p + step),
            reinterpret_cast<int64_t*>(p + 2 * step), reinterpret_cast<int32_t*>(p + 3 * step)};
}

void ragged_document_index(const RaggedIndex& idx, const int32_t* positions, int B, int T, int max_docs,
                           int rows_per_group, int Hq, int Hkv, int D, cudaStream_t stream) {
    QT_CHECK(max_docs >= 1 && max_docs <= 4096, "ragged_document_index: max_docs ", max_docs,
             " must be in 1..4096 (its document starts sit in shared memory)");
    QT_CHECK(rows_per_group >= 1 && B % rows_per_group == 0, "ragged_document_index: ", rows_per_group,
             " rows per group do not divide B=", B);
    const int64_t qkv_cols = static_cast<int64_t>(Hq + 2 * Hkv) * D, o_cols = static_cast<int64_t>(Hq) * D;
    ragged_index_kernel<<<B, kThreads, static_cast<std::size_t>(max_docs) * sizeof(int), stream>>>(
        idx, positions, T, max_docs, rows_per_group, qkv_cols, o_cols, Hq);
    CUDA_CHECK(cudaGetLastError());
}

int max_documents_per_row(const int32_t* positions, int B, int T) {
    int most = 0;
    for (int b = 0; b < B; ++b) {
        int n = 0;
        for (int t = 0; t < T; ++t) n += positions[static_cast<int64_t>(b) * T + t] == 0;
        most = std::max(most, n);
    }
    return most;
}

}  // namespace qtrain::cuda
