#include "cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/gemm_autotune.h"

namespace qtrain {

#define CUBLAS_CHECK(call)                                                                              \
    do {                                                                                                \
        cublasStatus_t st_ = (call);                                                                    \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                               \
            ::qtrain::throw_error(::qtrain::cat("cuBLAS error ", cublasGetStatusName(st_), " (",         \
                                                cublasGetStatusString(st_), ") in ", #call, " at ",     \
                                                __FILE__, ":", __LINE__));                              \
    } while (0)

namespace {

cudaDataType_t cuda_type(DType t) {
    switch (t) {
        case DType::F32: return CUDA_R_32F;
        case DType::BF16: return CUDA_R_16BF;
        case DType::F16: return CUDA_R_16F;
        case DType::E4M3: return CUDA_R_8F_E4M3;
        case DType::E5M2: return CUDA_R_8F_E5M2;
        default: throw_error(cat("GEMM: unsupported dtype ", dtype_name(t)));
    }
}


using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int, bool,
                       bool, int, bool, int>;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The rules cuBLASLt sets for FP8 matmuls (cuBLAS docs, cublasLtMatmul: "To use FP8 kernels, the
// following set of requirements must be satisfied": TN format, 16-byte aligned pointers and matrix
// dimensions, compute type 32F, scale type 32F; the FP8 type table: no e5m2 x e5m2, C = D type when D
// is bf16/fp32, bias bf16), checked here so a violation names itself instead of surfacing as
// CUBLAS_STATUS_NOT_SUPPORTED / "no algorithm".
void check_fp8_op(const GemmOp& op) {
    const auto where = [&] {
        return cat(" (FP8 GEMM m=", op.m, " n=", op.n, " k=", op.k, " A ", dtype_name(op.a_type), " B ",
                   dtype_name(op.b_type), " C ", dtype_name(op.c_type), ")");
    };
    QT_CHECK(is_fp8(op.a_type) && is_fp8(op.b_type),
             "FP8 GEMM: both operands must be fp8 (e4m3/e5m2); quantize the other one too", where());
    QT_CHECK(!(op.a_type == DType::E5M2 && op.b_type == DType::E5M2),
             "FP8 GEMM: e5m2 x e5m2 is not supported by cuBLASLt; quantize one operand (weights or activations) "
             "as e4m3", where());
    QT_CHECK(op.trans_a && !op.trans_b,
             "FP8 GEMM: cuBLASLt needs the TN layout (A transposed, B not: both operands K-major); make the "
             "K-major copy with quantize_fp8_transpose", where());
    QT_CHECK(op.c_type == DType::BF16 || op.c_type == DType::F32, "FP8 GEMM: output must be bf16 or fp32",
             where());
    QT_CHECK(op.bias == nullptr || op.bias_type == DType::BF16,
             "FP8 GEMM: the bias must be bf16 (cuBLASLt's FP8 bias type for bf16 and fp32 outputs)", where());
    QT_CHECK(op.a_scale != nullptr && op.b_scale != nullptr,
             "FP8 GEMM: a_scale and b_scale (device pointers to the inverse scales) are required", where());
    QT_CHECK(aligned16(op.a_scale) && aligned16(op.b_scale),
             "FP8 GEMM: a_scale / b_scale must be 16-byte aligned (cuBLASLt 13 rejects others; give every scale "
             "its own 16-byte slot)", where());
    const int64_t c_size = static_cast<int64_t>(dtype_size(op.c_type));
    QT_CHECK(op.k % 16 == 0 && op.m % 16 == 0, "FP8 GEMM: m and k must be multiples of 16", where());
    QT_CHECK(op.lda % 16 == 0 && op.ldb % 16 == 0 && (op.ldc * c_size) % 16 == 0,
             "FP8 GEMM: leading dimensions must be multiples of 16 bytes (lda=", op.lda, " ldb=", op.ldb,
             " ldc=", op.ldc, ")", where());
    QT_CHECK(aligned16(op.a) && aligned16(op.b) && aligned16(op.c) && (op.bias == nullptr || aligned16(op.bias)),
             "FP8 GEMM: A, B, C and bias must be 16-byte aligned", where());
}

struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    std::unique_ptr<detail::AlgoTrials> trials;  // --gemm-autotune, until this shape is decided
};

// Autotuned choices of the whole process, per device, workspace size (a candidate may need up to the
// runner's workspace) and shape (see GemmRunner's comment).
using TunedKey = std::tuple<int, std::size_t, Key>;
struct TunedChoices {
    std::mutex mutex;
    std::map<TunedKey, cublasLtMatmulAlgo_t> algos;
};
TunedChoices& tuned_choices() {
    static TunedChoices t;
    return t;
}

}  // namespace

struct GemmRunner::Impl {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    std::size_t workspace_bytes = 0;
    std::map<Key, Plan> plans;
    bool autotune = false;
    GemmTuningStats stats;

    ~Impl() {
        for (auto& [k, p] : plans) {
            cublasLtMatrixLayoutDestroy(p.a);
            cublasLtMatrixLayoutDestroy(p.b);
            cublasLtMatrixLayoutDestroy(p.c);
            cublasLtMatmulDescDestroy(p.desc);
        }
        if (workspace) cudaFree(workspace);
        if (handle) cublasLtDestroy(handle);
    }

    static Key key_of(const GemmOp& op) {
        const bool fp8 = is_fp8(op.a_type) || is_fp8(op.b_type);
        return Key{op.trans_a, op.trans_b, op.m, op.n, op.k, op.lda, op.ldb, op.ldc, static_cast<int>(op.a_type),
                   static_cast<int>(op.b_type), static_cast<int>(op.c_type), static_cast<int>(op.bias_type),
                   op.bias != nullptr, op.beta != 0.0f, fp8, fp8 && op.fp8_fast_accum, op.min_alignment};
    }

    Plan& plan_for(const Key& key, const GemmOp& op) {
        const bool fp8 = is_fp8(op.a_type) || is_fp8(op.b_type);
        auto it = plans.find(key);
        if (it != plans.end()) return it->second;

        Plan p;
        // fp32 products stay exact fp32 (no TF32): fp32 mode is the tight reference for the GPU path.
        cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
        cublasOperation_t ta = op.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = op.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        if (op.bias) {
            p.epilogue = CUBLASLT_EPILOGUE_BIAS;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof p.epilogue));
            cudaDataType_t bt = cuda_type(op.bias_type);
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
        }
        if (fp8) {
            // Scale pointers are set again on every call (they may differ per call); set here too so the
            // heuristic sees a scaled FP8 matmul.
            int8_t fast_accum = op.fp8_fast_accum ? 1 : 0;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum));
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &op.a_scale, sizeof op.a_scale));
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &op.b_scale, sizeof op.b_scale));
        }
        const int64_t a_rows = op.trans_a ? op.k : op.m, a_cols = op.trans_a ? op.m : op.k;
        const int64_t b_rows = op.trans_b ? op.n : op.k, b_cols = op.trans_b ? op.k : op.n;
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, cuda_type(op.a_type), a_rows, a_cols, op.lda));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, cuda_type(op.b_type), b_rows, b_cols, op.ldb));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, cuda_type(op.c_type), op.m, op.n, op.ldc));

        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &workspace_bytes, sizeof workspace_bytes));
        if (op.min_alignment > 0) {  // (unset: cuBLASLt assumes 256-byte aligned pointers)
            const uint32_t align = static_cast<uint32_t>(op.min_alignment);
            for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
                CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align));
        }
        const int wanted = autotune ? GemmRunner::kAutotuneCandidates : 1;
        std::vector<cublasLtMatmulHeuristicResult_t> results(wanted);
        int found = 0;
        cublasStatus_t st =
            cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref, wanted, results.data(), &found);
        cublasLtMatmulPreferenceDestroy(pref);
        if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
            throw_error(cat("cuBLASLt has no algorithm for ", op.trans_a ? "T" : "N", op.trans_b ? "T" : "N", " GEMM m=",
                            op.m, " n=", op.n, " k=", op.k, " A ", dtype_name(op.a_type), " B ", dtype_name(op.b_type),
                            " C ", dtype_name(op.c_type), op.bias ? " with bias" : "", " (status ",
                            cublasGetStatusName(st), ")"));
        }
        p.algo = results[0].algo;
        if (autotune && found > 1) {
            std::lock_guard<std::mutex> lock(tuned_choices().mutex);
            auto it = tuned_choices().algos.find(TunedKey{device(), workspace_bytes, key});
            if (it != tuned_choices().algos.end()) {
                p.algo = it->second;  // decided by an earlier runner of this process
                ++stats.shapes_from_cache;
            } else {
                std::vector<cublasLtMatmulAlgo_t> cands;
                for (int i = 0; i < found; ++i) cands.push_back(results[i].algo);
                p.trials = std::make_unique<detail::AlgoTrials>(std::move(cands));
                ++stats.shapes_exploring;
            }
        }
        return plans.emplace(key, std::move(p)).first->second;
    }

    static int device() {
        int d = 0;
        CUDA_CHECK(cudaGetDevice(&d));
        return d;
    }

    // A shape still being tuned: one call with the next candidate (not while a CUDA graph is being
    // captured: its events could not be read, so the heuristic's choice runs then), and the choice
    // once every candidate has its timings. The process keeps the first choice made for a shape.
    void run_trial(const Key& key, Plan& p, const GemmOp& op, cudaStream_t stream) {
        detail::AlgoTrials& t = *p.trials;
        auto launch = [&](const cublasLtMatmulAlgo_t& algo) {
            return cublasLtMatmul(handle, p.desc, &op.alpha, op.a, p.a, op.b, p.b, &op.beta, op.c, p.c, op.c, p.c,
                                  &algo, workspace, workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
        };
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
        if (capture != cudaStreamCaptureStatusNone || t.decided()) {
            if (capture == cudaStreamCaptureStatusNone) decide(key, p);
            CUBLAS_CHECK(cublasLtMatmul(handle, p.desc, &op.alpha, op.a, p.a, op.b, p.b, &op.beta, op.c, p.c, op.c,
                                        p.c, &p.algo, workspace, workspace_bytes, stream));
            return;
        }
        ++stats.calls_timed;
        if (!t.run(launch, stream))
            throw_error(cat("cuBLASLt refused its own first choice for GEMM m=", op.m, " n=", op.n, " k=", op.k));
    }

    void decide(const Key& key, Plan& p) {
        detail::AlgoTrials& t = *p.trials;
        const int pick = t.best();
        ++stats.shapes_tuned;
        stats.heuristic_ms += std::max(0.0, t.best_ms(0));
        stats.chosen_ms += std::max(0.0, t.best_ms(pick));
        {
            std::lock_guard<std::mutex> lock(tuned_choices().mutex);
            p.algo = tuned_choices().algos.emplace(TunedKey{device(), workspace_bytes, key}, t.candidate(pick)).first->second;
        }
        p.trials.reset();
        --stats.shapes_exploring;
    }

};

GemmRunner::GemmRunner(std::size_t workspace_bytes, bool autotune) : impl_(std::make_unique<Impl>()) {
    CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
    impl_->workspace_bytes = workspace_bytes;
    impl_->autotune = autotune;
    CUDA_CHECK(cudaMalloc(&impl_->workspace, workspace_bytes));
}

GemmRunner::~GemmRunner() = default;

std::size_t GemmRunner::cached_shapes() const { return impl_->plans.size(); }

GemmTuningStats GemmRunner::tuning_stats() const { return impl_->stats; }

void GemmRunner::run(const GemmOp& op, cudaStream_t stream) {
    if (is_fp8(op.a_type) || is_fp8(op.b_type)) check_fp8_op(op);
    const Key key = Impl::key_of(op);
    Plan& p = impl_->plan_for(key, op);
    if (op.bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &op.bias, sizeof op.bias));
    if (op.a_scale)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &op.a_scale, sizeof op.a_scale));
    if (op.b_scale)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &op.b_scale, sizeof op.b_scale));
    if (p.trials) {
        impl_->run_trial(key, p, op, stream);
        return;
    }
    CUBLAS_CHECK(cublasLtMatmul(impl_->handle, p.desc, &op.alpha, op.a, p.a, op.b, p.b, &op.beta, op.c, p.c, op.c, p.c,
                                &p.algo, impl_->workspace, impl_->workspace_bytes, stream));
}

void GemmRunner::linear_forward(void* y, DType y_type, const void* x, const void* w, DType in_type, const void* bias,
                                int64_t n_tokens, int64_t in_f, int64_t out_f, cudaStream_t stream, float beta) {
    GemmOp op;
    op.trans_a = true;
    op.trans_b = false;
    op.m = out_f; op.n = n_tokens; op.k = in_f;
    op.a = w; op.a_type = in_type; op.lda = in_f;
    op.b = x; op.b_type = in_type; op.ldb = in_f;
    op.c = y; op.c_type = y_type; op.ldc = out_f;
    op.beta = beta;
    op.bias = bias;
    op.bias_type = in_type == DType::F32 ? DType::F32 : DType::BF16;
    run(op, stream);
}

void GemmRunner::linear_backward_input(void* dx, DType dx_type, const void* dy, const void* w, DType in_type,
                                       int64_t n_tokens, int64_t in_f, int64_t out_f, cudaStream_t stream, float beta) {
    GemmOp op;
    op.trans_a = false;
    op.trans_b = false;
    op.m = in_f; op.n = n_tokens; op.k = out_f;
    op.a = w; op.a_type = in_type; op.lda = in_f;
    op.b = dy; op.b_type = in_type; op.ldb = out_f;
    op.c = dx; op.c_type = dx_type; op.ldc = in_f;
    op.beta = beta;
    run(op, stream);
}

void GemmRunner::linear_backward_weight(void* dw, DType dw_type, const void* dy, const void* x, DType in_type,
                                        int64_t n_tokens, int64_t in_f, int64_t out_f, bool accumulate,
                                        cudaStream_t stream) {
    GemmOp op;
    op.trans_a = false;
    op.trans_b = true;
    op.m = in_f; op.n = out_f; op.k = n_tokens;
    op.a = x; op.a_type = in_type; op.lda = in_f;
    op.b = dy; op.b_type = in_type; op.ldb = out_f;
    op.c = dw; op.c_type = dw_type; op.ldc = in_f;
    op.beta = accumulate ? 1.0f : 0.0f;
    run(op, stream);
}

// ---- FP8 helpers: every operand K-major (TN), see gemm.h ----

void GemmRunner::linear_forward_fp8(void* y, DType y_type, const void* xq, DType x_type, const float* x_inv_scale,
                                    const void* wq, DType w_type, const float* w_inv_scale, const void* bias,
                                    int64_t n_tokens, int64_t in_f, int64_t out_f, cudaStream_t stream, float beta,
                                    bool fast_accum) {
    GemmOp op;
    op.trans_a = true;
    op.trans_b = false;
    op.m = out_f; op.n = n_tokens; op.k = in_f;
    op.a = wq; op.a_type = w_type; op.lda = in_f; op.a_scale = w_inv_scale;
    op.b = xq; op.b_type = x_type; op.ldb = in_f; op.b_scale = x_inv_scale;
    op.c = y; op.c_type = y_type; op.ldc = out_f;
    op.beta = beta;
    op.bias = bias;
    op.bias_type = DType::BF16;
    op.fp8_fast_accum = fast_accum;
    run(op, stream);
}

void GemmRunner::linear_backward_input_fp8(void* dx, DType dx_type, const void* dyq, DType dy_type,
                                           const float* dy_inv_scale, const void* wTq, DType w_type,
                                           const float* w_inv_scale, int64_t n_tokens, int64_t in_f, int64_t out_f,
                                           cudaStream_t stream, float beta, bool fast_accum) {
    GemmOp op;
    op.trans_a = true;
    op.trans_b = false;
    op.m = in_f; op.n = n_tokens; op.k = out_f;
    op.a = wTq; op.a_type = w_type; op.lda = out_f; op.a_scale = w_inv_scale;
    op.b = dyq; op.b_type = dy_type; op.ldb = out_f; op.b_scale = dy_inv_scale;
    op.c = dx; op.c_type = dx_type; op.ldc = in_f;
    op.beta = beta;
    op.fp8_fast_accum = fast_accum;
    run(op, stream);
}

void GemmRunner::linear_backward_weight_fp8(void* dw, DType dw_type, const void* dyTq, DType dy_type,
                                            const float* dy_inv_scale, const void* xTq, DType x_type,
                                            const float* x_inv_scale, int64_t n_tokens, int64_t in_f, int64_t out_f,
                                            bool accumulate, cudaStream_t stream, bool fast_accum) {
    GemmOp op;
    op.trans_a = true;
    op.trans_b = false;
    op.m = in_f; op.n = out_f; op.k = n_tokens;
    op.a = xTq; op.a_type = x_type; op.lda = n_tokens; op.a_scale = x_inv_scale;
    op.b = dyTq; op.b_type = dy_type; op.ldb = n_tokens; op.b_scale = dy_inv_scale;
    op.c = dw; op.c_type = dw_type; op.ldc = in_f;
    op.beta = accumulate ? 1.0f : 0.0f;
    op.fp8_fast_accum = fast_accum;
    run(op, stream);
}

}  // namespace qtrain
