#include "model/cuda/lora_adapters.h"

#include <cstring>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cuda/check.h"
#include "cuda/gemm.h"
#include "model/flag_names.h"

namespace qtrain {

namespace {

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing every pointer and
// row stride in bytes: the adapters' tensors sit on 64-element boundaries and q|k|v's slices at any
// column, so their GEMMs tell cuBLASLt what alignment to expect (GemmOp::min_alignment).
int alignment_of(std::initializer_list<uint64_t> values) {
    int a = 256;
    for (uint64_t v : values)
        while (a > 1 && v % static_cast<uint64_t>(a) != 0) a /= 2;
    return a;
}
uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// The row-major products of gemm.h, with row strides (ld*, elements) and alpha, beta.
//   y[N,out] = alpha x[N,in] w[out,in]^T + beta y
void gemm_fwd(GemmRunner& g, DType t, void* y, int64_t ldy, const void* x, int64_t ldx, const void* w, int64_t ldw,
              int64_t N, int64_t in, int64_t out, float alpha, float beta, cudaStream_t s) {
    const uint64_t es = dtype_size(t);
    GemmOp op;
    op.trans_a = true;
    op.m = out, op.n = N, op.k = in;
    op.a = w, op.a_type = t, op.lda = ldw;
    op.b = x, op.b_type = t, op.ldb = ldx;
    op.c = y, op.c_type = t, op.ldc = ldy;
    op.alpha = alpha, op.beta = beta;
    op.min_alignment = alignment_of({addr(y), addr(x), addr(w), ldy * es, ldx * es, ldw * es});
    g.run(op, s);
}
//   dx[N,in] = alpha dy[N,out] w[out,in] + beta dx
void gemm_bwd_input(GemmRunner& g, DType t, void* dx, int64_t lddx, const void* dy, int64_t lddy, const void* w,
                    int64_t ldw, int64_t N, int64_t in, int64_t out, float alpha, float beta, cudaStream_t s) {
    const uint64_t es = dtype_size(t);
    GemmOp op;
    op.m = in, op.n = N, op.k = out;
    op.a = w, op.a_type = t, op.lda = ldw;
    op.b = dy, op.b_type = t, op.ldb = lddy;
    op.c = dx, op.c_type = t, op.ldc = lddx;
    op.alpha = alpha, op.beta = beta;
    op.min_alignment = alignment_of({addr(dx), addr(dy), addr(w), lddx * es, lddy * es, ldw * es});
    g.run(op, s);
}
//   dw[out,in] (fp32) += alpha dy[N,out]^T x[N,in]
void gemm_bwd_weight(GemmRunner& g, DType t, float* dw, const void* dy, int64_t lddy, const void* x, int64_t ldx,
                     int64_t N, int64_t in, int64_t out, float alpha, cudaStream_t s) {
    const uint64_t es = dtype_size(t);
    GemmOp op;
    op.trans_b = true;
    op.m = in, op.n = out, op.k = N;
    op.a = x, op.a_type = t, op.lda = ldx;
    op.b = dy, op.b_type = t, op.ldb = lddy;
    op.c = dw, op.c_type = DType::F32, op.ldc = in;
    op.alpha = alpha, op.beta = 1.0f;
    op.min_alignment = alignment_of({addr(dw), addr(dy), addr(x), static_cast<uint64_t>(in) * 4, lddy * es, ldx * es});
    g.run(op, s);
}

// The adapters' optimizer: fp32 moments, fp32 gradient, whatever the base's flags say.
ModelOptions adapter_optimizer_options(const ModelOptions& o) {
    ModelOptions a = o;
    a.opt_m_dtype = a.opt_v_dtype = a.param_grad_dtype = DType::F32;
    return a;
}

}  // namespace

LoraAdapters::LoraAdapters(const LoraBuffers& buffers, const ModelConfig& config, const ModelOptions& options,
                           GemmRunner& gemm, cudaStream_t stream, OpTimer& timer)
    : buf_(buffers),
      config_(config),
      lora_(options.lora),
      act_(options.model_dtype),
      layout_(make_lora_layout(config, options.lora)),
      gemm_(gemm),
      stream_(stream),
      timer_(timer),
      rows_(static_cast<int64_t>(options.batch_size) * options.seq_len),
      host_(config, options.lora) {
    optimizer_ = std::make_unique<OptimizerState>(buf_.opt, adapter_optimizer_options(options));
    std::vector<cuda::ParamSegment> segs;
    for (std::size_t i = 0; i < layout_.specs.size(); ++i)
        segs.push_back({layout_.offsets[i], layout_.specs[i].numel(), layout_.specs[i].decay() ? 1 : 0, -1});
    optimizer_->upload_segments(segs, stream_);
    host_.init(lora_.seed);
    upload_from_host();
}

LoraAdapters::~LoraAdapters() = default;

const void* LoraAdapters::A(int l, LoraTarget t) const {
    return static_cast<const char*>(buf_.weights) + layout_.a_offset[layout_.index(l, t)] * dtype_size(act_);
}
const void* LoraAdapters::B(int l, LoraTarget t) const {
    return static_cast<const char*>(buf_.weights) + layout_.b_offset[layout_.index(l, t)] * dtype_size(act_);
}
void* LoraAdapters::saved(int l, LoraTarget t) const {
    // slot k holds [N, r] for the planned micro-batch of N = batch x seq rows
    const int64_t k = layout_.saved_slot[layout_.index(l, t)];
    return static_cast<char*>(buf_.saved) + k * rows_ * lora_.rank * dtype_size(act_);
}

const void* LoraAdapters::dropped(int l, LoraTarget t, const void* x, int64_t n, bool training) {
    if (!training || lora_.dropout <= 0.0f) return x;
    auto t_ = timer_.scope("lora dropout", stream_);
    cuda::lora_dropout_forward(act_, buf_.xd, x, n, lora_.seed, buf_.pass, static_cast<uint64_t>(layout_.index(l, t)),
                               lora_.dropout, stream_);
    return buf_.xd;
}

void LoraAdapters::forward(int l, LoraTarget t, void* y, int64_t ldy, const void* x, int N, bool training) {
    if (!has(l, t)) return;
    const auto [out, in] = lora_target_shape(config_, t);
    const int64_t r = lora_.rank;
    const void* xin = dropped(l, t, x, static_cast<int64_t>(N) * in, training);
    auto t_ = timer_.scope("lora gemm", stream_);
    void* u = saved(l, t);
    gemm_fwd(gemm_, act_, u, r, xin, in, A(l, t), in, N, in, r, 1.0f, 0.0f, stream_);  // u = drop(x) A^T
    gemm_fwd(gemm_, act_, y, ldy, u, r, B(l, t), r, N, r, out, lora_.scale(), 1.0f, stream_);  // y += s u B^T
}

void LoraAdapters::backward(int l, LoraTarget t, void* dx, const void* dy, int64_t ldy, const void* x, int N) {
    if (!has(l, t)) return;
    const auto [out, in] = lora_target_shape(config_, t);
    const int64_t r = lora_.rank;
    const int i = layout_.index(l, t);
    const bool dropping = lora_.dropout > 0.0f;
    const void* xin = dropped(l, t, x, static_cast<int64_t>(N) * in, true);  // the forward's mask again
    auto t_ = timer_.scope("lora gemm", stream_);
    const float s = lora_.scale();
    float* dA = buf_.grads + layout_.a_offset[i];
    float* dB = buf_.grads + layout_.b_offset[i];
    gemm_bwd_input(gemm_, act_, buf_.dh, r, dy, ldy, B(l, t), r, N, r, out, s, 0.0f, stream_);  // g = s dy B
    gemm_bwd_weight(gemm_, act_, dB, dy, ldy, saved(l, t), r, N, r, out, s, stream_);        // dB += s dy^T u
    gemm_bwd_weight(gemm_, act_, dA, buf_.dh, r, xin, in, N, in, r, 1.0f, stream_);          // dA += g^T drop(x)
    if (!dropping) {
        gemm_bwd_input(gemm_, act_, dx, in, buf_.dh, r, A(l, t), in, N, in, r, 1.0f, 1.0f, stream_);  // dx += g A
        return;
    }
    // dx += mask * (g A): through the forward's mask (the base's path has none)
    gemm_bwd_input(gemm_, act_, buf_.dxd, in, buf_.dh, r, A(l, t), in, N, in, r, 1.0f, 0.0f, stream_);
    cuda::lora_dropout_backward_add(act_, dx, buf_.dxd, static_cast<int64_t>(N) * in, lora_.seed, buf_.pass,
                                    static_cast<uint64_t>(i), lora_.dropout, stream_);
}

void LoraAdapters::end_pass() {
    cuda::lora_count_pass(buf_.pass, static_cast<uint64_t>(world_), stream_);
    host_.set_passes(host_.passes() + static_cast<uint64_t>(world_));
}

void LoraAdapters::set_ranks(int rank, int world) {
    rank_ = rank, world_ = world;
    const uint64_t pass = host_.passes() + static_cast<uint64_t>(rank_);
    CUDA_CHECK(cudaMemcpyAsync(buf_.pass, &pass, sizeof pass, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void LoraAdapters::all_reduce_grads(comm::Communicator& comm) {
    auto t_ = timer_.scope("lora gradient all-reduce", stream_);
    // the padding between tensors is zero on every rank: summing the whole space adds nothing there
    comm.all_reduce(buf_.grads, buf_.grads, static_cast<std::size_t>(layout_.total), DType::F32, stream_);
}

void LoraAdapters::sum_squares(float* partials) {
    cuda::sum_squares_partials(partials, buf_.grads, DType::F32, layout_.total, stream_);
}

void LoraAdapters::update(const cuda::AdamWArgs& args, const float* clip) {
    // (an fp32 model's GEMMs read the master itself; a bf16 one's the copy AdamW writes)
    optimizer_->update(args, {buf_.master, buf_.grads, act_ == DType::F32 ? nullptr : buf_.weights}, 0, layout_.total,
                       clip, nullptr, stream_);
    write_base();
    zero_grads();
}

void LoraAdapters::bind_base(void* weights, std::vector<int64_t> offsets) {
    QT_CHECK(offsets.size() == layout_.trained_base.size(), "GPU model: internal error (",
             flag(&LoraOptions::train_also), ": ", offsets.size(), " base offsets for ", layout_.trained_base.size(),
             " tensors)");
    base_ = weights;
    base_offsets_ = std::move(offsets);
}

float* LoraAdapters::trained_grad(const std::string& hf_name) const {
    for (std::size_t k = 0; k < layout_.trained_base.size(); ++k)
        if (layout_.trained_base[k] == hf_name) return buf_.grads + layout_.offsets[layout_.first_trained + k];
    return nullptr;
}

void LoraAdapters::write_base() {
    if (!base_) return;
    const std::size_t es = dtype_size(act_);
    for (std::size_t k = 0; k < base_offsets_.size(); ++k) {
        const std::size_t i = layout_.first_trained + k;
        // rounded to nearest, as AdamW's copy of an fp32 master is: a resume's upload writes these same bits
        // (one small conversion per tensor, outside the captured graph: ~2-4 per layer per step)
        cuda::convert_from_f32(static_cast<char*>(base_) + base_offsets_[k] * es, act_, buf_.master + layout_.offsets[i],
                               layout_.specs[i].numel(), stream_);
    }
}

void LoraAdapters::read_base_into_host(const std::string& hf_name) {
    if (!base_) return;
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const std::size_t es = dtype_size(act_);
    for (std::size_t k = 0; k < base_offsets_.size(); ++k) {
        if (!hf_name.empty() && layout_.trained_base[k] != hf_name) continue;
        const ParamSpec& s = layout_.specs[layout_.first_trained + k];
        const int64_t n = s.numel();
        std::vector<uint8_t> raw(static_cast<std::size_t>(n) * es);
        CUDA_CHECK(cudaMemcpy(raw.data(), static_cast<const char*>(base_) + base_offsets_[k] * es, raw.size(),
                              cudaMemcpyDeviceToHost));
        float* to = host_.param(s.name);
        if (act_ == DType::F32) {
            std::memcpy(to, raw.data(), raw.size());
            continue;
        }
        QT_CHECK(act_ == DType::BF16, "GPU model: ", flag(&LoraOptions::train_also), " needs fp32 or bf16 weights");
        for (int64_t j = 0; j < n; ++j) {
            uint16_t b;
            std::memcpy(&b, raw.data() + j * es, sizeof b);
            to[j] = bf16_to_float(b);
        }
    }
}

void LoraAdapters::zero_grads() {
    CUDA_CHECK(cudaMemsetAsync(buf_.grads, 0, layout_.total * sizeof(float), stream_));
}

void LoraAdapters::upload_from_host() {
    const std::size_t n = static_cast<std::size_t>(layout_.total);
    std::vector<float> p(n, 0.0f), m(n, 0.0f), v(n, 0.0f);  // the padding stays zero
    for (std::size_t i = 0; i < layout_.specs.size(); ++i) {
        const int64_t from = host_.offsets()[i], to = layout_.offsets[i], k = layout_.specs[i].numel();
        std::memcpy(p.data() + to, host_.params().data() + from, k * sizeof(float));
        std::memcpy(m.data() + to, host_.moments_m().data() + from, k * sizeof(float));
        std::memcpy(v.data() + to, host_.moments_v().data() + from, k * sizeof(float));
    }
    const uint64_t pass = host_.passes() + static_cast<uint64_t>(rank_);  // (this rank's next pass)
    // ordered on the model's stream and finished on return (the host vectors go out of scope)
    CUDA_CHECK(cudaMemcpyAsync(buf_.master, p.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(buf_.opt.adam_m, m.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(buf_.opt.adam_v, v.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(buf_.pass, &pass, sizeof pass, cudaMemcpyHostToDevice, stream_));
    if (act_ != DType::F32) cuda::convert_from_f32(buf_.weights, act_, buf_.master, layout_.total, stream_);
    write_base();
    zero_grads();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void LoraAdapters::download_to_host() const {
    const std::size_t n = static_cast<std::size_t>(layout_.total);
    std::vector<float> p(n), m(n), v(n);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(p.data(), buf_.master, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(m.data(), buf_.opt.adam_m, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(v.data(), buf_.opt.adam_v, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < layout_.specs.size(); ++i) {
        const int64_t to = host_.offsets()[i], from = layout_.offsets[i], k = layout_.specs[i].numel();
        std::memcpy(host_.params().data() + to, p.data() + from, k * sizeof(float));
        std::memcpy(host_.moments_m().data() + to, m.data() + from, k * sizeof(float));
        std::memcpy(host_.moments_v().data() + to, v.data() + from, k * sizeof(float));
    }
}

int64_t LoraAdapters::spec_index(const std::string& name) const {
    for (std::size_t i = 0; i < layout_.specs.size(); ++i)
        if (layout_.specs[i].name == name) return static_cast<int64_t>(i);
    throw_error(cat("GPU model: no LoRA adapter tensor named '", name, "'"));
}

std::vector<float> LoraAdapters::download(const std::string& name, Which which) const {
    const int64_t i = spec_index(name);
    const int64_t off = layout_.offsets[i], n = layout_.specs[i].numel();
    const float* base = which == Which::Master  ? buf_.master
                        : which == Which::Grad  ? buf_.grads
                        : which == Which::AdamM ? static_cast<const float*>(buf_.opt.adam_m)
                                                : static_cast<const float*>(buf_.opt.adam_v);
    std::vector<float> out(n);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(out.data(), base + off, n * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
}

}  // namespace qtrain
