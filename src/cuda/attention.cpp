// Argument checks and dtype dispatch for the attention kernels (attention_flash_*.cu, attention_fp32.cu).
// Everything a kernel silently relies on (head dim, GQA divisibility, 16-byte alignment for vector
// and cp.async loads, grid limits) is checked here once, so a bad call fails with a message instead
// of reading out of bounds.
#include "cuda/attention.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "cuda/attention_cudnn.h"
#include "cuda/attention_ragged.h"
#include "cuda/fp8.h"

namespace qtrain {
namespace {

bool aligned(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

void check_shape(DType dtype, const AttentionShape& s, const char* what) {
    QT_CHECK(dtype == DType::F32 || dtype == DType::BF16, what, ": dtype must be fp32 or bf16, got ",
             dtype_name(dtype));
    QT_CHECK(s.D == 64 || s.D == 128, what, ": head dim ", s.D, " is not supported (64 or 128)");
    QT_CHECK(s.B >= 1 && s.T >= 1 && s.Hq >= 1 && s.Hkv >= 1, what, ": bad shape B=", s.B, " T=", s.T, " Hq=", s.Hq,
             " Hkv=", s.Hkv);
    QT_CHECK(s.Hq % s.Hkv == 0, what, ": query heads ", s.Hq, " not a multiple of kv heads ", s.Hkv);
    QT_CHECK(s.Hq <= 65535 && s.B <= 65535, what, ": Hq ", s.Hq, " and B ", s.B, " must be <= 65535 (grid limits)");
    // lse/delta are indexed with 32-bit ints inside the kernels.
    QT_CHECK(static_cast<int64_t>(s.B) * s.Hq * s.T < (int64_t{1} << 31), what, ": B*Hq*T too large");
}

void check_ptr(const void* p, std::uintptr_t align, const char* what, const char* name) {
    QT_CHECK(p != nullptr, what, ": ", name, " is null");
    QT_CHECK(aligned(p, align), what, ": ", name, " must be ", align, "-byte aligned");
}

// The cuDNN backend is for bf16 only; fp32 keeps its reference kernels whatever was asked.
bool use_cudnn(DType dtype, AttentionBackend backend) {
    return dtype == DType::BF16 && backend == AttentionBackend::Cudnn;
}

// cuDNN runs document masking as its variable-length attention, one sequence per document, with
// shape.max_docs sequence slots per row (attention_ragged.h): it needs that count.
void check_cudnn_positions(DType dtype, AttentionBackend backend, const AttentionShape& s, const int32_t* positions,
                           const char* what) {
    if (!use_cudnn(dtype, backend)) return;
    QT_CHECK(!positions || s.max_docs > 0, what,
             ": document masking (positions) on the cuDNN backend needs AttentionShape::max_docs > 0 (the document "
             "slots per row of its ragged batch)");
    QT_CHECK(positions || s.max_docs == 0, what, ": AttentionShape::max_docs=", s.max_docs,
             " asks for cuDNN's ragged (document-masked) attention, but no positions were given");
}

// Where the ragged index sits in the cuDNN workspace (first), and where cuDNN's own part starts.
void* cudnn_workspace_after_index(void* workspace, const AttentionShape& s) {
    return static_cast<char*>(workspace) + cuda::ragged_index_bytes(s.B, s.max_docs);
}

}  // namespace

bool attention_backend_available(AttentionBackend backend, std::string* why) {
    if (backend == AttentionBackend::Flash) return true;
    return detail::cudnn_attention_available(why);
}

void attention_forward(DType dtype, void* out, float* lse, const void* qkv, const AttentionShape& s,
                       cudaStream_t stream, float* amax, AttentionBackend backend, void* workspace,
                       const int32_t* positions) {
    check_shape(dtype, s, "attention_forward");
    check_ptr(out, 16, "attention_forward", "out");
    check_ptr(lse, 4, "attention_forward", "lse");
    check_ptr(qkv, 16, "attention_forward", "qkv");
    QT_CHECK(!amax || dtype == DType::BF16, "attention_forward: the fused abs-max is for bf16 (FP8 training) only");
    check_cudnn_positions(dtype, backend, s, positions, "attention_forward");
    if (positions) check_ptr(positions, 4, "attention_forward", "positions");
    if (use_cudnn(dtype, backend) && positions) {
        check_ptr(workspace, 16, "attention_forward", "workspace (the cuDNN ragged index)");
        const cuda::RaggedIndex idx = cuda::ragged_index_at(workspace, s.B, s.max_docs);
        cuda::ragged_document_index(idx, positions, s.B, s.T, s.max_docs, s.B, s.Hq, s.Hkv, s.D, stream);
        detail::cudnn_ragged_attention_forward(out, lse, qkv, idx, cudnn_workspace_after_index(workspace, s), s,
                                               stream);
        if (amax) cuda::abs_max(amax, DType::BF16, out, static_cast<int64_t>(s.B) * s.T * s.Hq * s.D, stream);
    } else if (use_cudnn(dtype, backend)) {
        detail::cudnn_attention_forward(out, lse, qkv, workspace, s, stream);
        if (amax) cuda::abs_max(amax, DType::BF16, out, static_cast<int64_t>(s.B) * s.T * s.Hq * s.D, stream);
    } else if (dtype == DType::BF16) {
        detail::flash_attention_forward(out, lse, qkv, s, stream, amax, positions);
    } else
        detail::fp32_attention_forward(static_cast<float*>(out), lse, static_cast<const float*>(qkv), s, stream,
                                       positions);
}

// The shape of one chunk of the backward (B / chunks sequences), after checking chunks divides B.
static AttentionShape chunk_shape(const AttentionShape& s, int chunks, const char* what) {
    QT_CHECK(chunks >= 1, what, ": chunks must be >= 1, got ", chunks);
    QT_CHECK(s.B % chunks == 0, what, ": batch size ", s.B, " is not divisible by ", chunks, " chunks");
    AttentionShape c = s;
    c.B = s.B / chunks;
    return c;
}

std::size_t attention_backward_workspace_bytes(DType dtype, const AttentionShape& s, int chunks,
                                               AttentionBackend backend) {
    check_shape(dtype, s, "attention_backward_workspace_bytes");
    const AttentionShape c = chunk_shape(s, chunks, "attention_backward_workspace_bytes");
    std::size_t bytes = 0;
    if (use_cudnn(dtype, backend) && s.max_docs > 0)  // document masking: the ragged index first
        bytes = cuda::ragged_index_bytes(s.B, s.max_docs) +
                std::max(detail::cudnn_ragged_attention_backward_workspace_bytes(c),
                         detail::cudnn_ragged_attention_forward_workspace_bytes(s));
    else if (use_cudnn(dtype, backend))
        bytes = std::max(detail::cudnn_attention_backward_workspace_bytes(c),
                         detail::cudnn_attention_forward_workspace_bytes(s));
    else
        bytes = static_cast<std::size_t>(c.B) * c.Hq * c.T * sizeof(float);
    return (bytes + 255) / 256 * 256;
}

void attention_backward(DType dtype, void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, void* workspace, const AttentionShape& s, cudaStream_t stream, int chunks,
                        AttentionBackend backend, const int32_t* positions) {
    check_shape(dtype, s, "attention_backward");
    check_cudnn_positions(dtype, backend, s, positions, "attention_backward");
    if (positions) check_ptr(positions, 4, "attention_backward", "positions");
    const AttentionShape c = chunk_shape(s, chunks, "attention_backward");
    check_ptr(dqkv, 16, "attention_backward", "dqkv");
    check_ptr(dout, 16, "attention_backward", "dout");
    check_ptr(qkv, 16, "attention_backward", "qkv");
    check_ptr(out, 16, "attention_backward", "out");
    check_ptr(lse, 4, "attention_backward", "lse");
    if (!use_cudnn(dtype, backend))  // the cuDNN backend checks its own (it may need none)
        check_ptr(workspace, 16, "attention_backward", "workspace");
    float* delta = static_cast<float*>(workspace);
    // cuDNN with positions: the index of every chunk (groups of c.B rows, offsets from each chunk's
    // base), written once before the chunks run; cuDNN's own workspace follows it.
    const bool ragged = use_cudnn(dtype, backend) && positions;
    cuda::RaggedIndex idx;
    void* cudnn_ws = workspace;
    if (ragged) {
        check_ptr(workspace, 16, "attention_backward", "workspace (the cuDNN ragged index)");
        idx = cuda::ragged_index_at(workspace, s.B, s.max_docs);
        cuda::ragged_document_index(idx, positions, s.B, s.T, s.max_docs, c.B, s.Hq, s.Hkv, s.D, stream);
        cudnn_ws = cudnn_workspace_after_index(workspace, s);
    }
    // Per chunk of c.B sequences: qkv/dqkv advance c.B*T rows of (Hq + 2*Hkv)*D elements, out/dout c.B*T
    // rows of Hq*D, lse ([B, Hq, T], or cuDNN ragged's [B*T, Hq]) c.B*Hq*T floats. Row widths are
    // multiples of 64 elements, so the offset pointers keep the 16-byte alignment checked above.
    const std::size_t es = dtype_size(dtype);
    const std::size_t rows = static_cast<std::size_t>(c.B) * c.T;
    const std::size_t qkv_step = rows * static_cast<std::size_t>(c.Hq + 2 * c.Hkv) * c.D * es;
    const std::size_t out_step = rows * static_cast<std::size_t>(c.Hq) * c.D * es;
    const std::size_t lse_step = static_cast<std::size_t>(c.B) * c.Hq * c.T;
    for (int i = 0; i < chunks; ++i) {
        char* dqkv_i = static_cast<char*>(dqkv) + i * qkv_step;
        const char* dout_i = static_cast<const char*>(dout) + i * out_step;
        const char* qkv_i = static_cast<const char*>(qkv) + i * qkv_step;
        const char* out_i = static_cast<const char*>(out) + i * out_step;
        const float* lse_i = lse + i * lse_step;
        const int32_t* pos_i = positions ? positions + i * rows : nullptr;  // c.B*T tokens per chunk
        if (ragged)
            detail::cudnn_ragged_attention_backward(dqkv_i, dout_i, qkv_i, out_i, lse_i, idx.group(i, c.B, s.max_docs),
                                                    cudnn_ws, c, stream);
        else if (use_cudnn(dtype, backend))
            detail::cudnn_attention_backward(dqkv_i, dout_i, qkv_i, out_i, lse_i, workspace, c, stream);
        else if (dtype == DType::BF16)
            detail::flash_attention_backward(dqkv_i, dout_i, qkv_i, out_i, lse_i, delta, c, stream, pos_i);
        else
            detail::fp32_attention_backward(reinterpret_cast<float*>(dqkv_i), reinterpret_cast<const float*>(dout_i),
                                            reinterpret_cast<const float*>(qkv_i),
                                            reinterpret_cast<const float*>(out_i), lse_i, delta, c, stream, pos_i);
    }
}

}  // namespace qtrain
