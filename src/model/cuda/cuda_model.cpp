#include "model/cuda/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "core/files.h"
#include "cuda/attention.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/gemm.h"
#include "cuda/fp8.h"
#include "cuda/kernels.h"
#include "io/safetensors.h"
#include "model/cpu/cpu_ops.h"
#include "model/parameters.h"

namespace qtrain {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// construction, options, plan
// ---------------------------------------------------------------------------------------------

void CudaModel::check_options(const ModelOptions& o) {
    auto unsupported = [](bool set, const char* flag) {
        QT_CHECK(!set, flag, " is not supported yet on --device=cuda");
    };
    QT_CHECK(o.model_dtype == DType::F32 || o.model_dtype == DType::BF16, "--model-dtype=", dtype_name(o.model_dtype),
             " is not supported on --device=cuda (fp32 or bf16)");
    const bool fp8 = o.matmul_dtype == DType::E4M3;
    QT_CHECK(o.matmul_dtype == o.model_dtype || (fp8 && o.model_dtype == DType::BF16), "--matmul-dtype=",
             dtype_name(o.matmul_dtype), " is not supported on --device=cuda with --model-dtype=",
             dtype_name(o.model_dtype), " (use the model dtype, or e4m3 with bf16)");
    QT_CHECK(o.gradient_dtype == o.model_dtype || (fp8 && is_fp8(o.gradient_dtype)), "--gradient-dtype=",
             dtype_name(o.gradient_dtype), " is not supported on --device=cuda with --matmul-dtype=",
             dtype_name(o.matmul_dtype), " (use the model dtype, or e4m3|e5m2 with --matmul-dtype=e4m3)");
    QT_CHECK(o.master_dtype == DType::F32, "--master-dtype=", dtype_name(o.master_dtype),
             " is not supported yet on --device=cuda");
    unsupported(o.offload_residual, "--offload-residual");
    QT_CHECK(!o.offload_master || o.model_dtype != DType::F32,
             "--offload-master needs --model-dtype=bf16 (in fp32 the master copy is the weights the GEMMs read)");
    QT_CHECK(!o.write_combined || o.offload_master || o.offload_opt_m || o.offload_opt_v || o.offload_gradients,
             "--write-combined applies to offloaded buffers: add --offload-master, --offload-opt-m, --offload-opt-v "
             "or --offload-gradients");
    unsupported(o.offload_quants, "--offload-quants");
    unsupported(o.persistent_quants, "--persistent-quants");
    unsupported(o.memcpy_all_gather, "--memcpy-all-gather");
    unsupported(o.shard_weights, "--shard-weights (or --zero-level=3)");
    unsupported(o.shard_gradients, "--shard-gradients (or --zero-level=2)");
    unsupported(o.attn_bwd_chunks != 1, "--attn-bwd-chunks");
    QT_CHECK(o.gpus == 1, "--gpus=", o.gpus, " is not supported yet (one GPU)");
}

// FP8 GEMMs need every dimension a multiple of 16 (cuBLASLt's FP8 alignment rules).
static void check_fp8_shapes(const ModelConfig& c, const ModelOptions& o) {
    const int64_t N = static_cast<int64_t>(o.batch_size) * o.seq_len;
    for (auto [what, v] : {std::pair<const char*, int64_t>{"batch-size x seq-len", N}, {"hidden_size", c.hidden_size},
                           {"q dim", c.q_dim()}, {"kv dim", c.kv_dim()}, {"intermediate_size", c.intermediate_size}})
        QT_CHECK(v % 16 == 0, "--matmul-dtype=e4m3 needs ", what, " to be a multiple of 16 (got ", v, ")");
}

MemoryPlan CudaModel::plan(const ModelConfig& config, const ModelOptions& options) {
    check_options(options);
    return gpu_memory_plan(config, options, "cuda");
}

CudaModel::CudaModel(const ModelConfig& config, const ModelOptions& options)
    : config_(config), opt_(options), layout_(make_gpu_layout(config)) {
    check_options(opt_);
    fp8_ = opt_.matmul_dtype == DType::E4M3;
    fp8_grads_ = fp8_ && is_fp8(opt_.gradient_dtype);
    if (fp8_) check_fp8_shapes(config_, opt_);
    QT_CHECK(cuda_device_count() > 0, "--device=cuda: no GPU is visible");
    CUDA_CHECK(cudaSetDevice(0));
    const GpuInfo info = cuda_device_info(0);
    device_name_ = info.name;
    plan_ = gpu_memory_plan(config_, opt_, device_name_);
    QT_CHECK(plan_.total_device() <= info.free_memory, "the memory plan needs ", human_bytes(plan_.total_device()),
             " on the GPU but only ", human_bytes(info.free_memory), " are free on ", info.name,
             "; reduce --batch-size or --seq-len, raise --lmhead-chunks, or use recompute/offload flags");

    arenas_ = make_arenas(opt_);
    {
        GpuBuffers measure;
        bind_gpu_buffers(measure, arenas_, config_, opt_, layout_);
    }
    for (Arena& a : arenas_) {
        const std::size_t bytes = a.used;
        a.used = 0;
        if (bytes == 0) continue;
        void* p = nullptr;
        if (a.pinned_host) {
            // mapped, so kernels can use it (zero-copy); write-combined only for the offloaded state
            const bool wc = opt_.write_combined && a.category != "Host staging";
            CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | (wc ? cudaHostAllocWriteCombined : 0)));
            void* dev = nullptr;
            CUDA_CHECK(cudaHostGetDevicePointer(&dev, p, 0));
            QT_CHECK(dev == p, "pinned host memory of category ", a.category,
                     " is not mapped at the same address on the GPU (unified addressing is required)");
        } else {
            CUDA_CHECK(cudaMalloc(&p, bytes));
        }
        a.base = static_cast<char*>(p);
    }
    bind_gpu_buffers(buf_, arenas_, config_, opt_, layout_);

    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&staging_free_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(staging_free_, stream_));
    gemm_ = std::make_unique<GemmRunner>(kGemmWorkspaceBytes);

    // zero everything with state (padding stays zero forever)
    zero(buf_.master, layout_.total * sizeof(float));
    if (buf_.weights != buf_.master)
        CUDA_CHECK(cudaMemsetAsync(buf_.weights, 0, layout_.total * dtype_size(opt_.model_dtype), stream_));
    zero(buf_.grads, layout_.total * sizeof(float));
    zero(buf_.adam_m, layout_.total * dtype_size(opt_.opt_m_dtype));
    zero(buf_.adam_v, layout_.total * dtype_size(opt_.opt_v_dtype));
    CUDA_CHECK(cudaMemsetAsync(buf_.loss_acc, 0, 4 * sizeof(float), stream_));

    // RoPE tables, computed on the host exactly as the CPU reference (and HF) does
    const int T = opt_.seq_len, half = config_.head_dim / 2;
    std::vector<float> cs(static_cast<std::size_t>(2) * T * half);
    cpu::rope_tables(cs.data(), cs.data() + static_cast<std::size_t>(T) * half, T, config_.head_dim, config_.rope_theta);
    CUDA_CHECK(cudaMemcpyAsync(buf_.cos_sin, cs.data(), cs.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));

    // weight-decay segments: one per tensor, sorted by offset
    std::vector<cuda::ParamSegment> segs;
    for (std::size_t i = 0; i < layout_.specs.size(); ++i)
        segs.push_back({layout_.offsets[i], layout_.specs[i].numel(), layout_.specs[i].decay() ? 1 : 0});
    std::sort(segs.begin(), segs.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
    CUDA_CHECK(cudaMemcpyAsync(buf_.segments, segs.data(), segs.size() * sizeof(cuda::ParamSegment),
                               cudaMemcpyHostToDevice, stream_));
    sync();
}

CudaModel::~CudaModel() {
    if (stream_) cudaStreamSynchronize(stream_);
    if (timer_.enabled() && timer_.steps() > 0) std::fprintf(stderr, "%s", timer_.report().c_str());
    gemm_.reset();
    for (Arena& a : arenas_) {
        if (!a.base) continue;
        if (a.pinned_host) cudaFreeHost(a.base);
        else cudaFree(a.base);
    }
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    if (graph_) cudaGraphDestroy(graph_);
    if (staging_free_) cudaEventDestroy(staging_free_);
    if (stream_) cudaStreamDestroy(stream_);
}

void CudaModel::sync() const { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

// Zeroes a buffer that may be device memory or offloaded (pinned host) memory.
void CudaModel::zero(void* p, std::size_t bytes) {
    cudaPointerAttributes attr{};
    CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
    if (attr.type == cudaMemoryTypeHost) {
        cuda::fill_zero(p, bytes, stream_);  // stream-ordered, like the memset below
    } else {
        CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    }
}

void CudaModel::refresh_weights() {
    if (buf_.weights != buf_.master)
        cuda::convert_from_f32(buf_.weights, opt_.model_dtype, buf_.master, layout_.total, stream_);
    quantize_weights();
}

int64_t CudaModel::matrix_offset(int l, Matrix m) const {
    const GpuLayerOffsets& o = layout_.layers[l];
    switch (m) {
        case kQkv: return o.qkv_w;
        case kO: return o.o_w;
        case kGateUp: return o.gate_up_w;
        default: return o.down_w;
    }
}

void CudaModel::quantize_weights() {
    if (!fp8_) return;
    auto t_ = timer_.scope("fp8 quantize", stream_);
    const ModelConfig& c = config_;
    const int64_t h = c.hidden_size, qd = c.q_dim(), qkvd = c.q_dim() + 2 * c.kv_dim(), I = c.intermediate_size;
    const int64_t rows[4] = {qkvd, h, 2 * I, h}, cols[4] = {h, qd, h, I};  // W[out, in]
    const std::size_t es = dtype_size(opt_.model_dtype);
    for (int l = 0; l < c.num_hidden_layers; ++l)
        for (int m = 0; m < 4; ++m) {
            const int64_t off = matrix_offset(l, static_cast<Matrix>(m));
            const void* w = static_cast<const char*>(buf_.weights) + off * es;
            float* amax = fp8_slot_ptr(fp8_slot(l, Fp8Slot::WeightAmax, m));
            float* inv = fp8_slot_ptr(fp8_slot(l, Fp8Slot::WeightInv, m));
            cuda::abs_max(amax, opt_.model_dtype, w, rows[m] * cols[m], stream_);
            if (fp8_grads_) {  // row-major copy and transpose in one pass
                cuda::quantize_fp8_transpose(static_cast<char*>(buf_.wTq) + off, DType::E4M3, w, opt_.model_dtype,
                                             rows[m], cols[m], amax, inv, stream_, static_cast<char*>(buf_.wq) + off);
            } else {
                cuda::quantize_fp8(static_cast<char*>(buf_.wq) + off, DType::E4M3, w, opt_.model_dtype,
                                   rows[m] * cols[m], amax, inv, stream_);
            }
        }
}

float* CudaModel::act_amax(int l, Matrix m) const {
    return fp8_ ? fp8_slot_ptr(fp8_slot(l, Fp8Slot::ActAmax, m)) : nullptr;
}

float* CudaModel::grad_amax() const {
    return fp8_grads_ ? fp8_slot_ptr(fp8_grad_amax_slot(config_.num_hidden_layers)) : nullptr;
}

void CudaModel::linear_fwd(int l, Matrix m, void* y, const void* x, const void* bias, int N, int in, int out,
                           bool amax_ready) {
    const DType A = opt_.model_dtype;
    const int64_t off = matrix_offset(l, m);
    if (!fp8_) {
        auto t_ = timer_.scope("gemm fwd", stream_);
        gemm_->linear_forward(y, A, x, static_cast<const char*>(buf_.weights) + off * dtype_size(A), A, bias, N, in,
                              out, stream_);
        return;
    }
    float* xa = fp8_slot_ptr(fp8_slot(l, Fp8Slot::ActAmax, m));
    float* xi = fp8_slot_ptr(fp8_slot(l, Fp8Slot::ActInv, m));
    {
        auto t_ = timer_.scope("fp8 quantize", stream_);
        if (!amax_ready) cuda::abs_max(xa, A, x, static_cast<int64_t>(N) * in, stream_);
        cuda::quantize_fp8(buf_.xq, DType::E4M3, x, A, static_cast<int64_t>(N) * in, xa, xi, stream_);
    }
    auto t_ = timer_.scope("gemm fwd", stream_);
    gemm_->linear_forward_fp8(y, A, buf_.xq, DType::E4M3, xi, static_cast<const char*>(buf_.wq) + off, DType::E4M3,
                              fp8_slot_ptr(fp8_slot(l, Fp8Slot::WeightInv, m)), bias, N, in, out, stream_);
}

void CudaModel::linear_bwd(int l, Matrix m, void* dx, const void* dy, const void* x, int N, int in, int out,
                           bool amax_ready) {
    const DType A = opt_.model_dtype;
    const int64_t off = matrix_offset(l, m);
    float* dw = buf_.grads + off;
    if (!fp8_grads_) {
        const void* w = static_cast<const char*>(buf_.weights) + off * dtype_size(A);
        {
            auto t_ = timer_.scope("gemm bwd dx", stream_);
            gemm_->linear_backward_input(dx, A, dy, w, A, N, in, out, stream_);
        }
        auto t_ = timer_.scope("gemm bwd dw", stream_);
        gemm_->linear_backward_weight(dw, DType::F32, dy, x, A, N, in, out, true, stream_);
        return;
    }
    const DType gd = opt_.gradient_dtype;
    const int L = config_.num_hidden_layers;
    float* ga = fp8_slot_ptr(fp8_grad_amax_slot(L));
    float* gi = fp8_slot_ptr(fp8_grad_inv_slot(L));
    {
        auto t_ = timer_.scope("fp8 quantize", stream_);
        if (!amax_ready) cuda::abs_max(ga, A, dy, static_cast<int64_t>(N) * out, stream_);
        cuda::quantize_fp8_transpose(buf_.dyTq, gd, dy, A, N, out, ga, gi, stream_, buf_.dyq);
        cuda::quantize_fp8_transpose(buf_.xTq, DType::E4M3, x, A, N, in, fp8_slot_ptr(fp8_slot(l, Fp8Slot::ActAmax, m)),
                                     nullptr, stream_);
    }
    {
        auto t_ = timer_.scope("gemm bwd dx", stream_);
        gemm_->linear_backward_input_fp8(dx, A, buf_.dyq, gd, gi, static_cast<const char*>(buf_.wTq) + off,
                                         DType::E4M3, fp8_slot_ptr(fp8_slot(l, Fp8Slot::WeightInv, m)), N, in, out,
                                         stream_);
    }
    auto t_ = timer_.scope("gemm bwd dw", stream_);
    gemm_->linear_backward_weight_fp8(dw, DType::F32, buf_.dyTq, gd, gi, buf_.xTq, DType::E4M3,
                                      fp8_slot_ptr(fp8_slot(l, Fp8Slot::ActInv, m)), N, in, out, true, stream_);
}

// ---------------------------------------------------------------------------------------------
// weights in and out
// ---------------------------------------------------------------------------------------------

void CudaModel::init_random(uint64_t seed) {
    std::vector<float> host;
    for (std::size_t i = 0; i < layout_.specs.size(); ++i) {
        const ParamSpec& s = layout_.specs[i];
        host.resize(s.numel());
        init_parameter(s, config_, seed, host.data());
        CUDA_CHECK(cudaMemcpy(buf_.master + layout_.offsets[i], host.data(), host.size() * sizeof(float),
                              cudaMemcpyDefault));
    }
    zero(buf_.adam_m, layout_.total * dtype_size(opt_.opt_m_dtype));
    zero(buf_.adam_v, layout_.total * dtype_size(opt_.opt_v_dtype));
    refresh_weights();
    sync();
}

void CudaModel::load_hf(const std::string& model_dir) {
    SafeTensorsReader reader = SafeTensorsReader::open_dir(model_dir);
    std::vector<float> host;
    for (std::size_t i = 0; i < layout_.specs.size(); ++i) {
        const ParamSpec& s = layout_.specs[i];
        host.resize(s.numel());
        reader.read_f32(s.name, s.shape, host.data());
        CUDA_CHECK(cudaMemcpy(buf_.master + layout_.offsets[i], host.data(), host.size() * sizeof(float),
                              cudaMemcpyDefault));
    }
    refresh_weights();
    sync();
}

std::vector<float> CudaModel::download(const std::string& name, Which which) const {
    const ParamSpec& s = layout_.spec_of(name);
    const int64_t off = layout_.offset_of(name), n = s.numel();
    std::vector<float> out(n);
    sync();
    auto fetch = [&](const void* base, DType t) {
        if (t == DType::F32) {
            CUDA_CHECK(cudaMemcpy(out.data(), static_cast<const float*>(base) + off, n * sizeof(float),
                                  cudaMemcpyDefault));
        } else {
            std::vector<uint16_t> raw(n);
            CUDA_CHECK(cudaMemcpy(raw.data(), static_cast<const uint16_t*>(base) + off, n * sizeof(uint16_t),
                                  cudaMemcpyDefault));
            for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(raw[i]);
        }
    };
    switch (which) {
        case Which::Master: fetch(buf_.master, DType::F32); break;
        case Which::Weights: fetch(buf_.weights, opt_.model_dtype); break;
        case Which::Grad: fetch(buf_.grads, DType::F32); break;
        case Which::AdamM: fetch(buf_.adam_m, opt_.opt_m_dtype); break;
        case Which::AdamV: fetch(buf_.adam_v, opt_.opt_v_dtype); break;
    }
    return out;
}

void CudaModel::upload_master(const std::string& name, const float* data) {
    const ParamSpec& s = layout_.spec_of(name);
    const int64_t off = layout_.offset_of(name);
    CUDA_CHECK(cudaMemcpy(buf_.master + off, data, s.numel() * sizeof(float), cudaMemcpyDefault));
    refresh_weights();
    sync();
}

void CudaModel::save_hf(const std::string& dir) const {
    fs::create_directories(dir);
    const DType store = opt_.model_dtype;  // HF checkpoints carry the training dtype (bf16 or fp32)
    std::vector<std::vector<float>> host;
    host.reserve(layout_.specs.size());
    SafeTensorsWriter w;
    for (const ParamSpec& s : qwen2_parameters(config_)) {  // canonical HF order
        host.push_back(download(s.name, Which::Master));
        w.add_f32(s.name, s.shape, host.back().data(), store);
    }
    w.set_metadata("format", "pt");
    w.write((fs::path(dir) / "model.safetensors").string());
    ModelConfig out = config_;
    out.torch_dtype = store == DType::BF16 ? "bfloat16" : "float32";
    write_text_file_atomic((fs::path(dir) / "config.json").string(), model_config_to_json(out));
}

void CudaModel::save_checkpoint(const std::string& dir) const {
    std::vector<std::vector<float>> host;
    host.reserve(layout_.specs.size() * 3);
    SafeTensorsWriter model_w, opt_w;
    for (const ParamSpec& s : qwen2_parameters(config_)) {
        host.push_back(download(s.name, Which::Master));
        model_w.add_f32(s.name, s.shape, host.back().data(), DType::F32);
        host.push_back(download(s.name, Which::AdamM));
        opt_w.add_f32(s.name + ".exp_avg", s.shape, host.back().data(), opt_.opt_m_dtype);
        host.push_back(download(s.name, Which::AdamV));
        opt_w.add_f32(s.name + ".exp_avg_sq", s.shape, host.back().data(), opt_.opt_v_dtype);
    }
    model_w.write((fs::path(dir) / "model.safetensors").string());
    opt_w.write((fs::path(dir) / "optimizer.safetensors").string());
}

void CudaModel::load_checkpoint(const std::string& dir) {
    SafeTensorsReader model_r({(fs::path(dir) / "model.safetensors").string()});
    SafeTensorsReader opt_r({(fs::path(dir) / "optimizer.safetensors").string()});
    std::vector<float> host;
    float* staging = nullptr;
    CUDA_CHECK(cudaMalloc(&staging, sizeof(float) * static_cast<std::size_t>(std::max<int64_t>(1, [&] {
                   int64_t m = 0;
                   for (const auto& s : layout_.specs) m = std::max(m, s.numel());
                   return m;
               }()))));
    try {
        for (std::size_t i = 0; i < layout_.specs.size(); ++i) {
            const ParamSpec& s = layout_.specs[i];
            const int64_t off = layout_.offsets[i], n = s.numel();
            host.resize(n);
            model_r.read_f32(s.name, s.shape, host.data());
            CUDA_CHECK(cudaMemcpy(buf_.master + off, host.data(), n * sizeof(float), cudaMemcpyDefault));
            auto load_moment = [&](const std::string& key, void* base, DType t) {
                opt_r.read_f32(key, s.shape, host.data());
                CUDA_CHECK(cudaMemcpy(staging, host.data(), n * sizeof(float), cudaMemcpyDefault));
                cuda::convert_from_f32(static_cast<char*>(base) + off * dtype_size(t), t, staging, n, stream_);
                sync();
            };
            load_moment(s.name + ".exp_avg", buf_.adam_m, opt_.opt_m_dtype);
            load_moment(s.name + ".exp_avg_sq", buf_.adam_v, opt_.opt_v_dtype);
        }
    } catch (...) {
        cudaFree(staging);
        throw;
    }
    CUDA_CHECK(cudaFree(staging));
    zero(buf_.grads, layout_.total * sizeof(float));
    CUDA_CHECK(cudaMemsetAsync(buf_.loss_acc, 0, 4 * sizeof(float), stream_));
    refresh_weights();
    sync();
}

// ---------------------------------------------------------------------------------------------
// the step
// ---------------------------------------------------------------------------------------------

void CudaModel::upload_batch(const Batch& batch, bool with_embedding_plan, float loss_scale, float grad_dscale) {
    const int B = batch.batch_size, T = batch.seq_len;
    QT_CHECK(B == opt_.batch_size && T == opt_.seq_len, "GPU model: batch of ", B, "x", T,
             " does not match the planned --batch-size=", opt_.batch_size, " --seq-len=", opt_.seq_len);
    const int N = B * T;
    // the previous upload out of the staging buffer must be done before it is overwritten
    CUDA_CHECK(cudaEventSynchronize(staging_free_));
    int32_t* st = buf_.host_staging;
    int32_t *h_in = st, *h_tgt = st + N, *h_unique = st + 2 * N, *h_off = st + 3 * N, *h_pos = st + 4 * N + 1;
    for (int i = 0; i < N; ++i) {
        QT_CHECK(batch.inputs[i] >= 0 && batch.inputs[i] < config_.vocab_size, "GPU model: input token ",
                 batch.inputs[i], " at position ", i, " is outside the vocabulary (", config_.vocab_size, ")");
        QT_CHECK(batch.targets[i] < config_.vocab_size, "GPU model: target token ", batch.targets[i], " at position ", i,
                 " is outside the vocabulary (", config_.vocab_size, ")");
    }
    std::memcpy(h_in, batch.inputs, N * sizeof(int32_t));
    std::memcpy(h_tgt, batch.targets, N * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(buf_.inputs, h_in, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(buf_.targets, h_tgt, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    if (with_embedding_plan) {
        // group positions by token (stable: increasing position within a token) for the
        // deterministic embedding backward
        std::vector<int32_t> order(N);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return batch.inputs[a] < batch.inputs[b]; });
        int u = 0;
        for (int i = 0; i < N; ++i) {
            if (i == 0 || batch.inputs[order[i]] != batch.inputs[order[i - 1]]) {
                h_unique[u] = batch.inputs[order[i]];
                h_off[u] = i;
                ++u;
            }
            h_pos[i] = order[i];
        }
        h_off[u] = N;
        int32_t* h_scalars = st + 5 * N + 1;
        h_scalars[2] = u;
        CUDA_CHECK(cudaMemcpyAsync(buf_.emb_unique, h_unique, u * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaMemcpyAsync(buf_.emb_offsets, h_off, (u + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaMemcpyAsync(buf_.emb_positions, h_pos, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    }
    int32_t* h_scalars = st + 5 * N + 1;
    std::memcpy(h_scalars, &loss_scale, 4);
    std::memcpy(h_scalars + 1, &grad_dscale, 4);
    CUDA_CHECK(cudaMemcpyAsync(buf_.step_scalars, h_scalars, 3 * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(staging_free_, stream_));
}

void CudaModel::forward(int B, int T) {
    const ModelConfig& c = config_;
    const DType A = opt_.model_dtype;
    const int N = B * T, h = c.hidden_size, qd = c.q_dim(), qkvd = c.q_dim() + 2 * c.kv_dim(),
              I = c.intermediate_size, L = c.num_hidden_layers;
    const float eps = static_cast<float>(c.rms_norm_eps);
    const std::size_t es = dtype_size(A);
    auto W = [&](int64_t off) { return static_cast<const void*>(static_cast<const char*>(buf_.weights) + off * es); };
    const AttentionShape shape{B, T, c.num_attention_heads, c.num_key_value_heads, c.head_dim};

    {
        auto t_ = timer_.scope("embedding", stream_);
        cuda::embedding_forward(A, buf_.layers[0].res_in, buf_.inputs, W(layout_.embed), N, h, stream_);
    }
    {
        auto t_ = timer_.scope("rmsnorm fwd", stream_);
        cuda::residual_rmsnorm_forward(A, buf_.layers[0].res_in, buf_.layers[0].ln1, buf_.layers[0].rstd1,
                                       buf_.layers[0].res_in, nullptr, W(layout_.layers[0].ln1), N, h, eps, stream_);
    }
    for (int l = 0; l < L; ++l) {
        const GpuLayerOffsets& o = layout_.layers[l];
        GpuLayerActivations& x = buf_.layers[l];
        // attention block
        linear_fwd(l, kQkv, x.qkv, x.ln1, W(o.qkv_b), N, h, qkvd);
        {
            auto t_ = timer_.scope("rope", stream_);
            cuda::rope_forward(A, x.qkv, buf_.cos_sin, B, T, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                               stream_);
        }
        {
            auto t_ = timer_.scope("attention fwd", stream_);
            attention_forward(A, x.att, x.lse, x.qkv, shape, stream_);
        }
        linear_fwd(l, kO, buf_.tmp_h, x.att, nullptr, N, qd, h);
        {
            auto t_ = timer_.scope("rmsnorm fwd", stream_);
            cuda::residual_rmsnorm_forward(A, x.res_mid, x.ln2, x.rstd2, x.res_in, buf_.tmp_h, W(o.ln2), N, h, eps,
                                           stream_);
        }
        // MLP block
        linear_fwd(l, kGateUp, x.gate_up, x.ln2, nullptr, N, h, 2 * I);
        {
            auto t_ = timer_.scope("swiglu", stream_);
            cuda::swiglu_forward(A, x.swi, x.gate_up, N, I, stream_, act_amax(l, kDown));
        }
        linear_fwd(l, kDown, buf_.tmp_h, x.swi, nullptr, N, I, h, fp8_);
        // residual add fused with the next norm (the next layer's input norm, or the final norm)
        const bool last = l + 1 == L;
        void* next_res = last ? buf_.res_final : buf_.layers[l + 1].res_in;
        void* next_norm = last ? buf_.xf : buf_.layers[l + 1].ln1;
        float* next_rstd = last ? buf_.rstd_final : buf_.layers[l + 1].rstd1;
        const void* next_w = last ? W(layout_.final_norm) : W(layout_.layers[l + 1].ln1);
        {
            auto t_ = timer_.scope("rmsnorm fwd", stream_);
            cuda::residual_rmsnorm_forward(A, next_res, next_norm, next_rstd, x.res_mid, buf_.tmp_h, next_w, N, h, eps,
                                           stream_);
        }
    }
}

// Regenerates the activations of layer l that the recompute flags did not keep, with the same
// kernels on the same inputs as the forward, so the backward sees bit-identical values.
void CudaModel::recompute_layer(int l, int B, int T) {
    const RecomputeSet rc = recompute_set(opt_);
    if (!rc.any()) return;
    const ModelConfig& c = config_;
    const DType A = opt_.model_dtype;
    const int N = B * T, h = c.hidden_size, qd = c.q_dim(), qkvd = c.q_dim() + 2 * c.kv_dim(),
              I = c.intermediate_size;
    const float eps = static_cast<float>(c.rms_norm_eps);
    const std::size_t es = dtype_size(A);
    auto W = [&](int64_t off) { return static_cast<const void*>(static_cast<const char*>(buf_.weights) + off * es); };
    const AttentionShape shape{B, T, c.num_attention_heads, c.num_key_value_heads, c.head_dim};
    const GpuLayerOffsets& o = layout_.layers[l];
    GpuLayerActivations& x = buf_.layers[l];
    auto t_ = timer_.scope("recompute", stream_);
    // The forward computes each norm from the stored (rounded) residual, so renormalising the stored
    // residual (no delta) gives the same output and rstd.
    if (rc.ln1)
        cuda::residual_rmsnorm_forward(A, x.res_in, x.ln1, x.rstd1, x.res_in, nullptr, W(o.ln1), N, h, eps, stream_);
    if (rc.qkv) {
        linear_fwd(l, kQkv, x.qkv, x.ln1, W(o.qkv_b), N, h, qkvd);
        cuda::rope_forward(A, x.qkv, buf_.cos_sin, B, T, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                           stream_);
    }
    if (rc.att) attention_forward(A, x.att, x.lse, x.qkv, shape, stream_);
    if (rc.res_mid) {
        linear_fwd(l, kO, buf_.tmp_h, x.att, nullptr, N, qd, h);
        cuda::residual_rmsnorm_forward(A, x.res_mid, x.ln2, x.rstd2, x.res_in, buf_.tmp_h, W(o.ln2), N, h, eps,
                                       stream_);
    } else if (rc.ln2) {
        cuda::residual_rmsnorm_forward(A, x.res_mid, x.ln2, x.rstd2, x.res_mid, nullptr, W(o.ln2), N, h, eps, stream_);
    }
    if (rc.gate_up) linear_fwd(l, kGateUp, x.gate_up, x.ln2, nullptr, N, h, 2 * I);
    if (rc.swi) cuda::swiglu_forward(A, x.swi, x.gate_up, N, I, stream_, act_amax(l, kDown));
}

void CudaModel::lm_head(int N, float* loss_acc, bool with_grads) {
    const ModelConfig& c = config_;
    const DType A = opt_.model_dtype;
    const int h = c.hidden_size, V = c.vocab_size;
    const std::size_t es = dtype_size(A);
    const void* w_lm = static_cast<const char*>(buf_.weights) + layout_.lm_head * es;
    float* dw_lm = buf_.grads + layout_.lm_head;
    for (int r0 = 0; r0 < N; r0 += buf_.lmhead_chunk_rows) {
        const int rows = std::min(buf_.lmhead_chunk_rows, N - r0);
        const void* x = static_cast<const char*>(buf_.xf) + static_cast<std::size_t>(r0) * h * es;
        {
            auto t_ = timer_.scope("lm head gemm", stream_);
            gemm_->linear_forward(buf_.logits, A, x, w_lm, A, nullptr, rows, h, V, stream_);
        }
        {
            auto t_ = timer_.scope("cross entropy", stream_);
            cuda::softmax_cross_entropy(A, buf_.logits, buf_.losses + r0, buf_.targets + r0, rows, V,
                                        buf_.step_scalars + 1, with_grads, stream_);
        }
        if (with_grads) {
            void* dx = static_cast<char*>(buf_.d_ln) + static_cast<std::size_t>(r0) * h * es;
            {
                auto t_ = timer_.scope("lm head gemm", stream_);
                gemm_->linear_backward_input(dx, A, buf_.logits, w_lm, A, rows, h, V, stream_);
            }
            {
                auto t_ = timer_.scope("lm head gemm", stream_);
                gemm_->linear_backward_weight(dw_lm, DType::F32, buf_.logits, x, A, rows, h, V, true, stream_);
            }
        }
    }
    {
        auto t_ = timer_.scope("cross entropy", stream_);
        cuda::accumulate_loss(loss_acc, buf_.losses, N, buf_.step_scalars, stream_);
    }
}

void CudaModel::backward(int B, int T) {
    const ModelConfig& c = config_;
    const DType A = opt_.model_dtype;
    const int N = B * T, h = c.hidden_size, qd = c.q_dim(), qkvd = c.q_dim() + 2 * c.kv_dim(),
              I = c.intermediate_size, L = c.num_hidden_layers;
    const std::size_t es = dtype_size(A);
    auto W = [&](int64_t off) { return static_cast<const void*>(static_cast<const char*>(buf_.weights) + off * es); };
    auto G = [&](int64_t off) { return buf_.grads + off; };
    const AttentionShape shape{B, T, c.num_attention_heads, c.num_key_value_heads, c.head_dim};

    // final norm: d_res = d(res_final) from d(xf) (held in d_ln by lm_head)
    CUDA_CHECK(cudaMemsetAsync(buf_.d_res, 0, static_cast<std::size_t>(N) * h * es, stream_));
    {
        auto t_ = timer_.scope("rmsnorm bwd", stream_);
        cuda::rmsnorm_backward(A, buf_.d_res, G(layout_.final_norm), buf_.col_scratch, buf_.d_ln, buf_.res_final,
                               W(layout_.final_norm), buf_.rstd_final, N, h, stream_);
    }
    for (int l = L - 1; l >= 0; --l) {
        const GpuLayerOffsets& o = layout_.layers[l];
        GpuLayerActivations& x = buf_.layers[l];
        recompute_layer(l, B, T);
        // MLP: d_res is d(out of the MLP) and d(res_mid) through the skip connection
        linear_bwd(l, kDown, buf_.d_swi, buf_.d_res, x.swi, N, I, h);
        {
            auto t_ = timer_.scope("swiglu", stream_);
            cuda::swiglu_backward(A, buf_.d_gu, buf_.d_swi, x.gate_up, N, I, stream_, grad_amax());
        }
        linear_bwd(l, kGateUp, buf_.d_ln, buf_.d_gu, x.ln2, N, h, 2 * I, fp8_grads_);
        {
            auto t_ = timer_.scope("rmsnorm bwd", stream_);
            cuda::rmsnorm_backward(A, buf_.d_res, G(o.ln2), buf_.col_scratch, buf_.d_ln, x.res_mid, W(o.ln2), x.rstd2, N,
                                   h, stream_);
        }
        // attention: d_res is now d(res_mid) = d(attention output projection) and d(res_in)
        linear_bwd(l, kO, buf_.d_att, buf_.d_res, x.att, N, qd, h);
        {
            auto t_ = timer_.scope("attention bwd", stream_);
            attention_backward(A, buf_.d_qkv, buf_.d_att, x.qkv, x.att, x.lse, buf_.attn_workspace, shape, stream_);
        }
        {
            auto t_ = timer_.scope("rope", stream_);
            cuda::rope_backward(A, buf_.d_qkv, buf_.cos_sin, B, T, c.num_attention_heads, c.num_key_value_heads,
                                c.head_dim, stream_);
        }
        {
            auto t_ = timer_.scope("bias grad", stream_);
            cuda::bias_grad(G(o.qkv_b), buf_.col_scratch, A, buf_.d_qkv, N, qkvd, stream_);
        }
        linear_bwd(l, kQkv, buf_.d_ln, buf_.d_qkv, x.ln1, N, h, qkvd);
        {
            auto t_ = timer_.scope("rmsnorm bwd", stream_);
            cuda::rmsnorm_backward(A, buf_.d_res, G(o.ln1), buf_.col_scratch, buf_.d_ln, x.res_in, W(o.ln1), x.rstd1, N,
                                   h, stream_);
        }
    }
    {
        auto t_ = timer_.scope("embedding", stream_);
        cuda::embedding_backward(G(layout_.embed), A, buf_.d_res, buf_.emb_unique, buf_.emb_offsets, buf_.emb_positions,
                                 reinterpret_cast<const int32_t*>(buf_.step_scalars + 2), N, h, stream_);
    }
}

void CudaModel::forward_backward_ops(int B, int T) {
    forward(B, T);
    lm_head(B * T, buf_.loss_acc, true);
    backward(B, T);
}

void CudaModel::forward_backward(const Batch& batch, float grad_scale) {
    const int B = batch.batch_size, T = batch.seq_len, N = B * T;
    const int valid = cpu::count_valid_targets(batch.targets, N);
    const float dscale = valid ? grad_scale / static_cast<float>(valid) : 0.0f;
    upload_batch(batch, true, dscale, dscale);
    if (valid == 0) {  // nothing to learn from: no loss, no gradient
        forward(B, T);
        return;
    }
    // The per-op timer records events between ops, which a graph would hide: it runs eagerly.
    if (!opt_.use_cuda_graphs || timer_.enabled()) {
        forward_backward_ops(B, T);
        return;
    }
    if (!graph_exec_) {
        // Capture once. Every pointer and shape is fixed by the plan, and everything that changes
        // per micro-batch (tokens, the embedding grouping, the scales) is read from device memory
        // that upload_batch refreshes before each launch.
        CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        try {
            forward_backward_ops(B, T);
        } catch (...) {
            cudaGraph_t g = nullptr;
            cudaStreamEndCapture(stream_, &g);
            if (g) cudaGraphDestroy(g);
            throw;
        }
        CUDA_CHECK(cudaStreamEndCapture(stream_, &graph_));
        CUDA_CHECK(cudaGraphInstantiate(&graph_exec_, graph_, 0));
    }
    CUDA_CHECK(cudaGraphLaunch(graph_exec_, stream_));
}

StepStats CudaModel::optimizer_step(const OptimizerParams& p) {
    {
        auto t_ = timer_.scope("optimizer", stream_);
        cuda::global_norm(buf_.norm_out, buf_.norm_partials, buf_.grads, layout_.total, p.grad_clip, stream_);
        cuda::AdamWArgs args{p.learning_rate, p.beta1, p.beta2, p.epsilon, p.weight_decay, p.step, sr_seed_};
        cuda::adamw_update(static_cast<const cuda::ParamSegment*>(buf_.segments), buf_.num_segments, layout_.total,
                           buf_.master, buf_.grads, buf_.adam_m, opt_.opt_m_dtype, buf_.adam_v, opt_.opt_v_dtype,
                           buf_.weights == buf_.master ? nullptr : buf_.weights, opt_.model_dtype, buf_.norm_out,
                           args, stream_);
        zero(buf_.grads, layout_.total * sizeof(float));
    }
    quantize_weights();
    float host[4] = {0, 0, 0, 0};
    CUDA_CHECK(cudaMemcpyAsync(host, buf_.norm_out, 2 * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaMemcpyAsync(host + 2, buf_.loss_acc, sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaMemsetAsync(buf_.loss_acc, 0, sizeof(float), stream_));
    sync();
    timer_.collect();  // every scope of this step has ended (the optimizer's block above)
    return StepStats{host[2], host[0]};
}

std::vector<float> CudaModel::logits(const Batch& batch) {
    const int N = batch.batch_size * batch.seq_len, h = config_.hidden_size, V = config_.vocab_size;
    const DType A = opt_.model_dtype;
    const std::size_t es = dtype_size(A);
    upload_batch(batch, false, 0.0f, 0.0f);
    forward(batch.batch_size, batch.seq_len);
    std::vector<float> out(static_cast<std::size_t>(N) * V);
    float* chunk_f32 = nullptr;
    CUDA_CHECK(cudaMalloc(&chunk_f32, static_cast<std::size_t>(buf_.lmhead_chunk_rows) * V * sizeof(float)));
    const void* w_lm = static_cast<const char*>(buf_.weights) + layout_.lm_head * es;
    for (int r0 = 0; r0 < N; r0 += buf_.lmhead_chunk_rows) {
        const int rows = std::min(buf_.lmhead_chunk_rows, N - r0);
        const void* x = static_cast<const char*>(buf_.xf) + static_cast<std::size_t>(r0) * h * es;
        {
            auto t_ = timer_.scope("lm head gemm", stream_);
            gemm_->linear_forward(buf_.logits, A, x, w_lm, A, nullptr, rows, h, V, stream_);
        }
        cuda::convert_to_f32(chunk_f32, buf_.logits, A, static_cast<int64_t>(rows) * V, stream_);
        CUDA_CHECK(cudaMemcpyAsync(out.data() + static_cast<std::size_t>(r0) * V, chunk_f32,
                                   static_cast<std::size_t>(rows) * V * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    sync();
    CUDA_CHECK(cudaFree(chunk_f32));
    return out;
}

float CudaModel::evaluate(const Batch& batch) {
    const int N = batch.batch_size * batch.seq_len;
    const int valid = cpu::count_valid_targets(batch.targets, N);
    if (valid == 0) return 0.0f;
    upload_batch(batch, false, 1.0f / static_cast<float>(valid), 0.0f);
    forward(batch.batch_size, batch.seq_len);
    // a separate accumulator, so a training step in progress keeps its loss
    float* eval_acc = buf_.loss_acc + 1;
    CUDA_CHECK(cudaMemsetAsync(eval_acc, 0, sizeof(float), stream_));
    lm_head(N, eval_acc, false);
    float loss = 0;
    CUDA_CHECK(cudaMemcpyAsync(&loss, eval_acc, sizeof(float), cudaMemcpyDeviceToHost, stream_));
    sync();
    return loss;
}

}  // namespace qtrain
