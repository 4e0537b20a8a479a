// Document bounds of packed rows as cuDNN's ragged ("THD") batch: one sequence per document, for the
// cuDNN backend of attention.h with positions (document masking).
//
// cuDNN's graph fixes its batch dimension when it is built, so the number of sequences must not
// change with the micro-batch: every row gets M = AttentionShape::max_docs sequence slots. A row with
// n < M documents fills the M - n spare slots with copies of its shortest document (same offsets,
// same length), placed right after that document so the offsets never go down. A copy computes
// exactly what the original computes (same kernel, same inputs, same tile split), so its writes of
// out, lse, dq, dk and dv repeat the same bytes; it costs one short document's work. Zero-length
// sequences would cost nothing, but cuDNN supports them only from 9.25 (the frontend's tests gate
// them there; 9.22 gives NaN rows), and the H200 runs 9.19.
//
// The arrays live in device memory and are written by a kernel from the device positions, on the
// stream, before each cuDNN call: a captured CUDA graph replays the kernel too, so each micro-batch's
// documents reach cuDNN without rebuilding anything.
//
// Offsets are in elements from the base pointer of the chunk the call covers (the backward runs in
// chunks of rows_per_group rows): group g holds rows g*R .. g*R+R-1 (R = rows_per_group) and its
// R*M + 1 entries start at entry g*(R*M + 1); the last one is the group's end (offset past its
// tokens, length 0), as cuDNN's [N + 1] ragged-offset tensors have it.
//   qkv_off: token * (Hq + 2*Hkv) * D  (q, k, v, dq, dk, dv: views into the packed qkv rows)
//   o_off:   token * Hq * D            (out, dout)
//   lse_off: token * Hq                (lse as [tokens, Hq], token-major: cuDNN's ragged stats layout)
//   seq_len: the document's length     (seq_len_q = seq_len_kv)
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace qtrain::cuda {

struct RaggedIndex {
    int64_t* qkv_off = nullptr;
    int64_t* o_off = nullptr;
    int64_t* lse_off = nullptr;
    int32_t* seq_len = nullptr;

    // The view of group g when groups hold rows_per_group rows of max_docs slots each.
    RaggedIndex group(int g, int rows_per_group, int max_docs) const {
        const std::ptrdiff_t e = static_cast<std::ptrdiff_t>(g) * (static_cast<std::ptrdiff_t>(rows_per_group) * max_docs + 1);
        return {qkv_off + e, o_off + e, lse_off + e, seq_len + e};
    }
};

// Bytes of the arrays for B rows of max_docs slots in groups of any size (at most B groups), rounded
// up to 256.
std::size_t ragged_index_bytes(int B, int max_docs);

// The arrays laid out in `memory` (ragged_index_bytes(B, max_docs) bytes, 16-byte aligned).
RaggedIndex ragged_index_at(void* memory, int B, int max_docs);

// Writes the index of B rows of T tokens from positions ([B*T], attention.h's form) in groups of
// rows_per_group rows (must divide B). A row with more than max_docs documents is the caller's error
// (CudaModel::upload_batch refuses it on the host); here its documents past max_docs are dropped and
// its last slot runs to the row's end, so nothing is read or written outside the row.
void ragged_document_index(const RaggedIndex& idx, const int32_t* positions, int B, int T, int max_docs,
                           int rows_per_group, int Hq, int Hkv, int D, cudaStream_t stream);

// Documents per row of host positions ([B*T]): the largest count over the rows (what max_docs must
// cover).
int max_documents_per_row(const int32_t* positions, int B, int T);

}  // namespace qtrain::cuda
