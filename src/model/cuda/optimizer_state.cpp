// The AdamW update of the GPU model over the flat buffers: one zero-copy launch (offloaded arrays
// read and written over PCIe by the kernel itself), or with --offload-double-buffer a chunked
// pipeline on the copy engines:
//
//   in stream   H2D chunk k (slot k%2) ............ H2D chunk k+1 (slot (k+1)%2) ...
//   stream                   AdamW chunk k ................... AdamW chunk k+1 ...
//   out stream                             D2H chunk k .......................... D2H chunk k+1
//
// Chunk k+1's inputs arrive while chunk k is updated, and chunk k's results leave while chunk k+1
// is updated; a slot is refilled only after its previous chunk's write-back (out_done). The kernel
// indexes segments and stochastic-rounding bits by absolute element, so both ways (and any chunk
// size) give bit-identical results.
#include "model/cuda/optimizer_state.h"

#include <algorithm>

#include "core/error.h"
#include "cuda/check.h"

namespace qtrain {

OptimizerState::OptimizerState(const OptimizerBuffers& buffers, const ModelOptions& o)
    : buf_(buffers),
      m_type_(o.opt_m_dtype),
      v_type_(o.opt_v_dtype),
      grad_type_(o.param_grad_dtype),
      model_type_(o.model_dtype) {
    for (const auto& slots : buf_.stage) staged_ = staged_ || slots[0] != nullptr;
    if (!staged_) return;
    in_stream_ = cuda::Stream::non_blocking();
    out_stream_ = cuda::Stream::non_blocking();
    start_ = cuda::Event::ordering();
    for (int s = 0; s < 2; ++s)
        in_done_[s] = cuda::Event::ordering(), computed_[s] = cuda::Event::ordering(), out_done_[s] = cuda::Event::ordering();
}

OptimizerState::~OptimizerState() {
    for (cudaStream_t s : {in_stream_.get(), out_stream_.get()})
        if (s) cudaStreamSynchronize(s);
}

void OptimizerState::upload_segments(const std::vector<cuda::ParamSegment>& segments, cudaStream_t stream) {
    QT_CHECK(static_cast<int>(segments.size()) == buf_.num_segments, "OptimizerState: ", segments.size(),
             " segments for a table of ", buf_.num_segments);
    CUDA_CHECK(cudaMemcpyAsync(buf_.segments, segments.data(), segments.size() * sizeof(cuda::ParamSegment),
                               cudaMemcpyHostToDevice, stream));
}

void OptimizerState::update(const cuda::AdamWArgs& args, const Params& p, int64_t begin, int64_t end,
                            const float* clip, float* weight_amax, cudaStream_t stream) {
    QT_CHECK(begin >= 0 && end - begin <= buf_.elements, "OptimizerState: range [", begin, ", ", end,
             ") is larger than its ", buf_.elements, " elements");
    if (end <= begin) return;  // a rank whose block is all padding
    if (staged_) return update_staged(args, p, begin, end, clip, weight_amax, stream);
    cuda::adamw_update_range(static_cast<const cuda::ParamSegment*>(buf_.segments), buf_.num_segments, begin, end,
                             p.master, p.grads, grad_type_, buf_.adam_m, m_type_, buf_.adam_v, v_type_, p.weights,
                             model_type_, clip, args, weight_amax, stream);
}

void OptimizerState::update_staged(const cuda::AdamWArgs& args, const Params& p, int64_t range_begin,
                                   int64_t range_end, const float* clip, float* weight_amax, cudaStream_t stream) {
    const auto* segs = static_cast<const cuda::ParamSegment*>(buf_.segments);
    // the arrays in kOpt* order, their element types, whether AdamW reads / writes them
    void* const base[5] = {p.master, const_cast<void*>(p.grads), buf_.adam_m, buf_.adam_v, p.weights};
    const DType type[5] = {DType::F32, grad_type_, m_type_, v_type_, model_type_};
    const bool reads[5] = {true, true, true, true, p.master == nullptr};  // bf16 master: weights are read
    const bool writes[5] = {true, false, true, true, true};
    // the host arrays are complete once everything queued on `stream` so far is (the gradient flushes
    // were joined into it by the model)
    CUDA_CHECK(cudaEventRecord(start_, stream));
    CUDA_CHECK(cudaStreamWaitEvent(in_stream_, start_, 0));
    // chunk k covers the absolute elements [range_begin + rel, + n); the arrays are indexed by rel
    const int64_t P = range_end - range_begin, C = buf_.chunk;
    for (int64_t rel = 0, k = 0; rel < P; rel += C, ++k) {
        const int s = static_cast<int>(k & 1);
        const int64_t n = std::min(C, P - rel), begin = range_begin + rel;
        void* at[5];
        CUDA_CHECK(cudaStreamWaitEvent(in_stream_, out_done_[s], 0));  // slot s written back
        for (int a = 0; a < 5; ++a) {
            const std::size_t es = dtype_size(type[a]);
            char* host = base[a] ? static_cast<char*>(base[a]) + rel * es : nullptr;
            if (!buf_.stage[a][s]) {  // on the device: used in place
                at[a] = host;
                continue;
            }
            at[a] = buf_.stage[a][s];
            if (reads[a]) CUDA_CHECK(cudaMemcpyAsync(at[a], host, n * es, cudaMemcpyHostToDevice, in_stream_));
        }
        CUDA_CHECK(cudaEventRecord(in_done_[s], in_stream_));
        CUDA_CHECK(cudaStreamWaitEvent(stream, in_done_[s], 0));
        cuda::adamw_update_range(segs, buf_.num_segments, begin, begin + n, static_cast<float*>(at[kOptMaster]),
                                 at[kOptGrads], grad_type_, at[kOptM], m_type_, at[kOptV], v_type_, at[kOptWeights],
                                 model_type_, clip, args, weight_amax, stream);
        CUDA_CHECK(cudaEventRecord(computed_[s], stream));
        CUDA_CHECK(cudaStreamWaitEvent(out_stream_, computed_[s], 0));
        for (int a = 0; a < 5; ++a) {
            if (!buf_.stage[a][s] || !writes[a] || !base[a]) continue;
            const std::size_t es = dtype_size(type[a]);
            CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(base[a]) + rel * es, at[a], n * es, cudaMemcpyDeviceToHost,
                                       out_stream_));
        }
        CUDA_CHECK(cudaEventRecord(out_done_[s], out_stream_));
    }
    // what follows on `stream` (weight refresh, gradient zeroing, the next step) sees the updated host
    // state; the out stream is serial, so its last event covers every chunk
    CUDA_CHECK(cudaStreamWaitEvent(stream, out_done_[((P + C - 1) / C - 1) & 1], 0));
}

}  // namespace qtrain
