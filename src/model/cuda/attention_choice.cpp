#include "model/cuda/attention_choice.h"

#include <exception>

#include <cuda_runtime.h>

#include "core/error.h"
#include "cuda/attention_cudnn.h"
#include "model/flag_names.h"

namespace qtrain {
namespace {

bool gpu_visible() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return count > 0;
}

// The backend and, when auto fell back to flash, why.
AttentionBackend choose(const ModelConfig& c, const ModelOptions& o, std::string* why_not_cudnn) {
    if (o.attention == AttentionImpl::Flash) return AttentionBackend::Flash;
    const bool explicit_cudnn = o.attention == AttentionImpl::Cudnn;
    std::string why;
    if (o.model_dtype != DType::BF16) {
        QT_CHECK(!explicit_cudnn, flag(&ModelOptions::attention), "=cudnn needs ", flag(&ModelOptions::model_dtype),
                 "=bf16 (fp32 attention runs qtrain's fp32 kernels); use ", flag(&ModelOptions::attention),
                 "=auto or flash");
        return AttentionBackend::Flash;  // fp32 attention has one implementation; nothing fell back
    }
    // Packed rows need block-causal masks over each row's documents: qtrain's kernels do that (a
    // per-row key bound from Batch::positions). cuDNN does it as its variable-length SDPA, one ragged
    // sequence per document in --max-docs-per-row slots per row (cuda/attention_ragged.h): only when
    // asked for (--attention=cudnn) until it is measured against flash on real documents
    // (docs/perf-notes.md); auto keeps flash.
    if (o.document_masking && !explicit_cudnn) {
        if (why_not_cudnn)
            *why_not_cudnn = cat("document masking runs on qtrain's flash kernels; ", flag(&ModelOptions::attention),
                                 "=cudnn runs cuDNN's variable-length attention");
        return AttentionBackend::Flash;
    }
    bool ok = false;
    if (!gpu_visible()) {
        ok = detail::cudnn_attention_compiled();
        if (!ok) detail::cudnn_attention_available(&why);
    } else if (attention_backend_available(AttentionBackend::Cudnn, &why)) {
        // Build the graphs for this shape now: a shape cuDNN refuses fails here, with cuDNN's reason.
        try {
            const AttentionShape s = attention_shape(c, o, o.batch_size, o.seq_len, AttentionBackend::Cudnn);
            (void)attention_backward_workspace_bytes(DType::BF16, s, o.attn_bwd_chunks, AttentionBackend::Cudnn);
            ok = true;
        } catch (const std::exception& e) {  // qtrain::Error, or whatever the cuDNN frontend throws
            why = e.what();
        }
    }
    QT_CHECK(ok || !explicit_cudnn, flag(&ModelOptions::attention), "=cudnn: ", why, "; use ",
             flag(&ModelOptions::attention), "=flash");
    if (!ok && why_not_cudnn) *why_not_cudnn = why;
    return ok ? AttentionBackend::Cudnn : AttentionBackend::Flash;
}

}  // namespace

AttentionShape attention_shape(const ModelConfig& c, const ModelOptions& o, int B, int T, AttentionBackend backend) {
    AttentionShape s{B, T, c.num_attention_heads, c.num_key_value_heads, c.head_dim};
    if (o.document_masking && backend == AttentionBackend::Cudnn) {
        QT_CHECK(o.max_docs_per_row >= 1, flag(&ModelOptions::max_docs_per_row), " must be >= 1, got ",
                 o.max_docs_per_row);
        s.max_docs = o.max_docs_per_row;
    }
    return s;
}

AttentionBackend choose_attention_backend(const ModelConfig& c, const ModelOptions& o) {
    return choose(c, o, nullptr);
}

std::string describe_attention_backend(const ModelConfig& c, const ModelOptions& o) {
    std::string why;
    const AttentionBackend b = choose(c, o, &why);
    if (b == AttentionBackend::Cudnn)
        return o.document_masking ? cat("cudnn (variable-length: one sequence per document, up to ", o.max_docs_per_row,
                                        " per row, ", flag(&ModelOptions::max_docs_per_row), "; cuDNN ",
                                        detail::cudnn_runtime_version(), ")")
                                  : cat("cudnn (cuDNN ", detail::cudnn_runtime_version(), ")");
    return why.empty() ? "flash" : "flash (cuDNN: " + why + ")";
}

}  // namespace qtrain
