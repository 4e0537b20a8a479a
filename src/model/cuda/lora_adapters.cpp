#include "model/cuda/lora_adapters.h"

#include <algorithm>
#include <memory>
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
      // (rank 0's block of the --gpus ranks the buffers are planned for, until set_communicator: at
      // one GPU the whole space)
      shard_(param_shard(layout_.total, std::max(1, options.gpus), 0)),
      host_(config, options.lora) {
    optimizer_ = std::make_unique<OptimizerState>(buf_.opt, adapter_optimizer_options(options));
    std::vector<cuda::ParamSegment> segs;
    for (std::size_t i = 0; i < layout_.specs.size(); ++i)
        segs.push_back({layout_.offsets[i], layout_.specs[i].numel(), layout_.specs[i].decay() ? 1 : 0, -1});
    // (the optimizer's table is sorted by offset; the layout's order is not the specs' order)
    std::sort(segs.begin(), segs.end(),
              [](const cuda::ParamSegment& a, const cuda::ParamSegment& b) { return a.offset < b.offset; });
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

void LoraAdapters::forward(int l, LoraTarget t, void* y, int64_t ldy, const void* x, int N, bool training,
                           bool write) {
    QT_CHECK(!write || (has(l, t) && lora_.dropout <= 0.0f),
             "GPU model: internal error (a LoRA forward asked to write y it does not cover)");
    if (!has(l, t)) return;
    const auto [out, in] = lora_target_shape(config_, t);
    const int64_t r = lora_.rank;
    const void* xin = dropped(l, t, x, static_cast<int64_t>(N) * in, training);
    auto t_ = timer_.scope("lora gemm", stream_);
    void* u = saved(l, t);
    gemm_fwd(gemm_, act_, u, r, xin, in, A(l, t), in, N, in, r, 1.0f, 0.0f, stream_);  // u = drop(x) A^T
    gemm_fwd(gemm_, act_, y, ldy, u, r, B(l, t), r, N, r, out, lora_.scale(), write ? 0.0f : 1.0f,
             stream_);  // y += s u B^T (write: y =)
}

void LoraAdapters::backward(int l, LoraTarget t, void* dx, const void* dy, int64_t ldy, const void* x, int N,
                            bool write) {
    QT_CHECK(!write || (has(l, t) && lora_.dropout <= 0.0f),
             "GPU model: internal error (a LoRA backward asked to write dx it does not cover)");
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
        gemm_bwd_input(gemm_, act_, dx, in, buf_.dh, r, A(l, t), in, N, in, r, 1.0f, write ? 0.0f : 1.0f,
                       stream_);  // dx += g A (write: dx =)
        return;
    }
    // dx += mask * (g A): through the forward's mask (the base's path has none)
    gemm_bwd_input(gemm_, act_, buf_.dxd, in, buf_.dh, r, A(l, t), in, N, in, r, 1.0f, 0.0f, stream_);
    cuda::lora_dropout_backward_add(act_, dx, buf_.dxd, static_cast<int64_t>(N) * in, lora_.seed, buf_.pass,
                                    static_cast<uint64_t>(i), lora_.dropout, stream_);
}

LoraAdapters::Adapted LoraAdapters::adapted(int l, const LoraTarget* targets, const int64_t* cols, int n) const {
    QT_CHECK(n <= 3, "GPU model: internal error (", n, " LoRA targets of one matrix)");
    Adapted a;
    for (int j = 0; j < n; ++j)
        if (has(l, targets[j])) a.targets[a.n] = targets[j], a.cols[a.n++] = cols[j];
    return a;
}

bool LoraAdapters::writes_whole(int l, const LoraTarget* targets, int n) const {
    if (lora_.dropout > 0.0f) return false;
    for (int j = 0; j < n; ++j)
        if (!has(l, targets[j])) return false;
    return true;
}

void LoraAdapters::forward_matrix(int l, const LoraTarget* targets, const int64_t* cols, int n, void* y, int64_t ldy,
                                  const void* x, int N, bool training, bool write) {
    QT_CHECK(!write || writes_whole(l, targets, n),
             "GPU model: internal error (LoRA adapters asked to write a matrix's output they do not cover)");
    const Adapted a = adapted(l, targets, cols, n);
    const LoraTarget* present = a.targets;  // (G of them, writing from columns at[j])
    const int64_t* at = a.cols;
    const int G = a.n;
    const std::size_t es = dtype_size(act_);
    if (!layout_.stacked(l, present, G)) {
        for (int j = 0; j < G; ++j)
            forward(l, present[j], static_cast<char*>(y) + at[j] * es, ldy, x, N, training, write);
        return;
    }
    const int64_t r = lora_.rank, in = lora_target_shape(config_, present[0])[1], w = G * r;
    auto t_ = timer_.scope("lora gemm", stream_);
    char* u = static_cast<char*>(saved(l, present[0]));  // [N, G r]: the G consecutive slots
    gemm_fwd(gemm_, act_, u, w, x, in, A(l, present[0]), in, N, in, w, 1.0f, 0.0f, stream_);  // u = x [A..]^T
    for (int j = 0; j < G; ++j) {  // y_j += s u_j B_j^T
        const int64_t out = lora_target_shape(config_, present[j])[0];
        gemm_fwd(gemm_, act_, static_cast<char*>(y) + at[j] * es, ldy, u + j * r * es, w, B(l, present[j]), r, N, r,
                 out, lora_.scale(), write ? 0.0f : 1.0f, stream_);
    }
}

void LoraAdapters::backward_matrix(int l, const LoraTarget* targets, const int64_t* cols, int n, void* dx,
                                   const void* dy, int64_t ldy, const void* x, int N, bool write) {
    QT_CHECK(!write || writes_whole(l, targets, n),
             "GPU model: internal error (LoRA adapters asked to write an input gradient they do not cover)");
    const Adapted a = adapted(l, targets, cols, n);
    const std::size_t es = dtype_size(act_);
    const LoraTarget* present = a.targets;  // (G of them, reading dy from columns at[j])
    const int64_t* at = a.cols;
    const int G = a.n;
    if (!layout_.stacked(l, present, G)) {
        // (every target adds to the one dx: with `write` the first writes it)
        for (int j = 0; j < G; ++j)
            backward(l, present[j], dx, static_cast<const char*>(dy) + at[j] * es, ldy, x, N, write && j == 0);
        return;
    }
    const int64_t r = lora_.rank, in = lora_target_shape(config_, present[0])[1], w = G * r;
    const float s = lora_.scale();
    auto t_ = timer_.scope("lora gemm", stream_);
    const char* u = static_cast<const char*>(saved(l, present[0]));
    char* g = static_cast<char*>(buf_.dh);  // [N, G r]
    for (int j = 0; j < G; ++j) {
        const int i = layout_.index(l, present[j]);
        const int64_t out = lora_target_shape(config_, present[j])[0];
        const char* dyj = static_cast<const char*>(dy) + at[j] * es;
        gemm_bwd_input(gemm_, act_, g + j * r * es, w, dyj, ldy, B(l, present[j]), r, N, r, out, s, 0.0f,
                       stream_);                                                                 // g_j = s dy_j B_j
        gemm_bwd_weight(gemm_, act_, buf_.grads + layout_.b_offset[i], dyj, ldy, u + j * r * es, w, N, r, out, s,
                        stream_);                                                                // dB_j += s dy_j^T u_j
    }
    const int first = layout_.index(l, present[0]);
    gemm_bwd_weight(gemm_, act_, buf_.grads + layout_.a_offset[first], g, w, x, in, N, in, w, 1.0f, stream_);  // dA += g^T x
    gemm_bwd_input(gemm_, act_, dx, in, g, w, A(l, present[0]), in, N, in, w, 1.0f, write ? 0.0f : 1.0f,
                   stream_);  // dx += g [A..] (write: dx =)
}

void LoraAdapters::end_pass() {
    cuda::lora_count_pass(buf_.pass, static_cast<uint64_t>(world_), stream_);
    host_.set_passes(host_.passes() + static_cast<uint64_t>(world_));
}

void LoraAdapters::set_communicator(comm::Communicator* comm, int zero_level) {
    const int world = comm ? comm->world() : 1;
    // (the buffers were planned for --gpus ranks: a block of another size would not fit them)
    QT_CHECK(param_shard(layout_.total, world, 0).size <= buf_.opt.elements, "GPU model: LoRA planned for fewer ranks than the communicator's ", world);
    // the whole state into the host mirror: from the old ranks' blocks (collective with them), or,
    // before the first communicator, the mirror is what was last uploaded (no step runs without one)
    if (comm_) download_to_host();
    comm_ = world > 1 ? comm : nullptr;
    world_ = world;
    zero_level_ = zero_level;
    shard_ = param_shard(layout_.total, world, comm ? comm->rank() : 0);
    upload_from_host();  // this rank's block of it, and its next pass
}

void LoraAdapters::reduce_and_sum_squares(float* partials) {
    QT_CHECK(comm_ || shard_.world == 1, "GPU model: LoRA planned for ", shard_.world,
             " ranks needs their communicator (set_communicator) before a step");
    const int K = cuda::norm_partials_count();
    float* block = buf_.grads + shard_.rank * shard_.size;
    if (comm_) {
        auto t_ = timer_.scope("lora gradient reduction", stream_);
        // the padding between tensors and after the last block is zero on every rank: it sums to zero
        const std::size_t S = static_cast<std::size_t>(shard_.size);
        if (zero_level_ == 1)
            comm_->all_reduce(buf_.grads, buf_.grads, S * shard_.world, DType::F32, stream_);
        else
            comm_->reduce_scatter(buf_.grads, block, S, DType::F32, stream_);
    }
    cuda::sum_squares_partials(partials + shard_.rank * K, block, DType::F32, shard_.count(), stream_);
    if (comm_) comm_->all_gather(partials + shard_.rank * K, partials, K, DType::F32, stream_);
}

void LoraAdapters::update(const cuda::AdamWArgs& args, const float* clip) {
    const std::size_t es = dtype_size(act_);
    char* weights = static_cast<char*>(buf_.weights);
    // (an fp32 model's GEMMs on one GPU read the master itself; otherwise AdamW writes the block's
    // model-dtype copy, rounded to nearest)
    void* block_weights = buf_.weights == buf_.master ? nullptr : weights + shard_.begin * es;
    optimizer_->update(args, {buf_.master, buf_.grads + shard_.rank * shard_.size, block_weights}, shard_.begin,
                       shard_.end, clip, nullptr, stream_);
    if (comm_) {
        auto t_ = timer_.scope("lora weight all-gather", stream_);
        comm_->all_gather(weights + shard_.rank * shard_.size * es, weights, static_cast<std::size_t>(shard_.size),
                          act_, stream_);
    }
    write_base();
    zero_grads();
}

void LoraAdapters::bind_base(void* weights, std::vector<int64_t> offsets, std::function<void()> after_write) {
    QT_CHECK(offsets.size() == layout_.trained_base.size(), "GPU model: internal error (",
             flag(&LoraOptions::train_also), ": ", offsets.size(), " base offsets for ", layout_.trained_base.size(),
             " tensors)");
    after_write_ = std::move(after_write);
    base_ = weights;
    base_offsets_ = std::move(offsets);
}

float* LoraAdapters::trained_grad(const std::string& hf_name) const {
    for (std::size_t k = 0; k < layout_.trained_base.size(); ++k)
        if (layout_.trained_base[k] == hf_name) return buf_.grads + layout_.offsets[layout_.first_trained + k];
    return nullptr;
}

void LoraAdapters::write_base() {
    if (!base_ || (!block_.whole && !block_.gather)) return;  // (a block not bound yet: set_base_block)
    const std::size_t es = dtype_size(act_);
    for (std::size_t k = 0; k < base_offsets_.size(); ++k) {
        const std::size_t i = layout_.first_trained + k;
        // the whole model-dtype weights (every rank's block, gathered): the master rounded to
        // nearest, so a resume's upload writes these same bits (one small copy per tensor, outside
        // the captured graph: ~2-4 per layer per step). Under ZeRO-3 of the bf16 base, the part of
        // the tensor in this rank's block (the other parts are their owners' to write, from the same
        // whole values every rank holds after the adapters' all-gather).
        const int64_t off = base_offsets_[k], n = layout_.specs[i].numel();
        const int64_t lo = block_.whole ? off : std::max(off, block_.begin);
        const int64_t hi = block_.whole ? off + n : std::min(off + n, block_.end);
        if (lo >= hi) continue;
        const int64_t at = block_.whole ? lo : lo - block_.begin;
        CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(base_) + at * es,
                                   static_cast<const char*>(buf_.weights) + (layout_.offsets[i] + lo - off) * es,
                                   (hi - lo) * es, cudaMemcpyDefault, stream_));  // (a host copy: streamed)
    }
    if (after_write_ && !base_offsets_.empty()) after_write_();
}

void LoraAdapters::read_base_into_host(const std::string& hf_name) {
    if (!base_ || (!block_.whole && !block_.gather)) return;  // (a block not bound yet: set_base_block)
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const std::size_t es = dtype_size(act_);
    for (std::size_t k = 0; k < base_offsets_.size(); ++k) {
        if (!hf_name.empty() && layout_.trained_base[k] != hf_name) continue;
        const ParamSpec& s = layout_.specs[layout_.first_trained + k];
        const int64_t n = s.numel();
        std::vector<uint8_t> raw(static_cast<std::size_t>(n) * es);
        if (block_.whole) {
            CUDA_CHECK(cudaMemcpy(raw.data(), static_cast<const char*>(base_) + base_offsets_[k] * es, raw.size(),
                                  cudaMemcpyDefault));  // (the streamed base's is in pinned host memory)
        } else {
            // ZeRO-3 of the bf16 base: the whole tensor from its owners' blocks, in bounded pieces (an
            // embedding is ~1 GB at 7B) staged in the adapters' gradient buffer, which is planned and
            // holds at least this tensor in fp32 (it is in the adapters' layout); the upload_from_host
            // that follows every call (start_adapters, upload_master) zeroes it again
            const int64_t chunk = std::min<int64_t>(n, int64_t{1} << 24);
            void* dev = buf_.grads;
            for (int64_t j = 0; j < n; j += chunk) {
                const int64_t m = std::min(chunk, n - j);
                block_.gather(base_offsets_[k] + j, base_offsets_[k] + j + m, dev);
                CUDA_CHECK(cudaStreamSynchronize(stream_));
                CUDA_CHECK(cudaMemcpy(raw.data() + j * es, dev, static_cast<std::size_t>(m) * es, cudaMemcpyDeviceToHost));
            }
        }
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
    CUDA_CHECK(cudaMemsetAsync(buf_.grads, 0, shard_.padded_total() * sizeof(float), stream_));
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
    const uint64_t pass = host_.passes() + static_cast<uint64_t>(shard_.rank);  // (this rank's next pass)
    const std::size_t S = static_cast<std::size_t>(shard_.size), b = static_cast<std::size_t>(shard_.begin),
                      c = static_cast<std::size_t>(shard_.count());
    // this rank's block of the master and moments (the block's padding zero)
    CUDA_CHECK(cudaMemsetAsync(buf_.master, 0, S * sizeof(float), stream_));
    CUDA_CHECK(cudaMemsetAsync(buf_.opt.adam_m, 0, S * sizeof(float), stream_));
    CUDA_CHECK(cudaMemsetAsync(buf_.opt.adam_v, 0, S * sizeof(float), stream_));
    // ordered on the model's stream and finished on return (the host vectors go out of scope)
    CUDA_CHECK(cudaMemcpyAsync(buf_.master, p.data() + b, c * sizeof(float), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(buf_.opt.adam_m, m.data() + b, c * sizeof(float), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(buf_.opt.adam_v, v.data() + b, c * sizeof(float), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(buf_.pass, &pass, sizeof pass, cudaMemcpyHostToDevice, stream_));
    if (buf_.weights != buf_.master) {
        // the whole model-dtype weights from the whole values, staged in the gradient buffer (zeroed
        // below); every rank converts them as AdamW rounds them, to nearest
        CUDA_CHECK(cudaMemsetAsync(buf_.weights, 0, shard_.padded_total() * dtype_size(act_), stream_));
        CUDA_CHECK(cudaMemcpyAsync(buf_.grads, p.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        if (act_ == DType::F32)
            CUDA_CHECK(cudaMemcpyAsync(buf_.weights, buf_.grads, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
        else
            cuda::convert_from_f32(buf_.weights, act_, buf_.grads, layout_.total, stream_);
    }
    write_base();
    zero_grads();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void LoraAdapters::download_to_host() const {
    if (!comm_ && shard_.world > 1) return;  // (before set_communicator: the mirror is current)
    const std::size_t n = static_cast<std::size_t>(layout_.total), S = static_cast<std::size_t>(shard_.size);
    std::vector<float> p(shard_.padded_total()), m(p.size()), v(p.size());
    float* whole = nullptr;  // several ranks: every block, gathered
    if (comm_) CUDA_CHECK(cudaMalloc(&whole, p.size() * sizeof(float)));
    auto fetch = [&](const float* block, std::vector<float>& to) {
        const float* from = block;
        if (comm_) {
            comm_->all_gather(block, whole, S, DType::F32, stream_);
            from = whole;
        }
        CUDA_CHECK(cudaMemcpyAsync(to.data(), from, (comm_ ? p.size() : n) * sizeof(float), cudaMemcpyDeviceToHost,
                                   stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    };
    try {
        fetch(buf_.master, p);
        fetch(static_cast<const float*>(buf_.opt.adam_m), m);
        fetch(static_cast<const float*>(buf_.opt.adam_v), v);
    } catch (...) {
        cudaFree(whole);
        throw;
    }
    if (whole) CUDA_CHECK(cudaFree(whole));
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
    std::vector<float> out(n);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (which == Which::Grad) {  // whole on every rank (this rank's own, until the step reduces it)
        CUDA_CHECK(cudaMemcpy(out.data(), buf_.grads + off, n * sizeof(float), cudaMemcpyDeviceToHost));
        return out;
    }
    // several ranks: the master and moments of this rank's block only (an fp32 model's master is
    // also the whole weights, which every rank holds)
    if (which == Which::Master && act_ == DType::F32 && comm_) {
        CUDA_CHECK(cudaMemcpy(out.data(), static_cast<const float*>(buf_.weights) + off, n * sizeof(float),
                              cudaMemcpyDeviceToHost));
        return out;
    }
    // (otherwise each rank holds the master and moments of its block only: every block gathered into the
    // host mirror, collective, as upload_master is; before set_communicator the mirror is current)
    if (shard_.world > 1) {
        download_to_host();
        const std::vector<float>& all = which == Which::Master  ? host_.params()
                                        : which == Which::AdamM ? host_.moments_m()
                                                                : host_.moments_v();
        std::copy_n(all.begin() + host_.offset(name), n, out.begin());
        return out;
    }
    const float* base = which == Which::Master  ? buf_.master
                        : which == Which::AdamM ? static_cast<const float*>(buf_.opt.adam_m)
                                                : static_cast<const float*>(buf_.opt.adam_v);
    CUDA_CHECK(cudaMemcpy(out.data(), base + (off - shard_.begin), n * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
}

}  // namespace qtrain
