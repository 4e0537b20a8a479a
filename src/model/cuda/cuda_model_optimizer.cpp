// The AdamW update of the GPU model over the flat buffers: one zero-copy launch (offloaded arrays
// read and written over PCIe by the kernel itself), or with --offload-double-buffer a chunked
// pipeline on the copy engines:
//
//   in stream   H2D chunk k (slot k%2) ............ H2D chunk k+1 (slot (k+1)%2) ...
//   stream_                  AdamW chunk k ................... AdamW chunk k+1 ...
//   out stream                             D2H chunk k .......................... D2H chunk k+1
//
// Chunk k+1's inputs arrive while chunk k is updated, and chunk k's results leave while chunk k+1
// is updated; a slot is refilled only after its previous chunk's write-back (out_done). The kernel
// indexes segments and stochastic-rounding bits by absolute element, so both ways (and any chunk
// size) give bit-identical results.
#include "model/cuda/cuda_model.h"

#include <algorithm>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/kernels.h"

namespace qtrain {

void CudaModel::create_optimizer_streams() {
    opt_staged_ = false;
    for (const auto& slots : buf_.opt_stage) opt_staged_ = opt_staged_ || slots[0] != nullptr;
    if (!opt_staged_) return;
    CUDA_CHECK(cudaStreamCreateWithFlags(&opt_in_stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&opt_out_stream_, cudaStreamNonBlocking));
    auto event = [](cudaEvent_t& e) { CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); };
    event(opt_start_);
    for (int s = 0; s < 2; ++s) event(opt_in_done_[s]), event(opt_computed_[s]), event(opt_out_done_[s]);
}

void CudaModel::destroy_optimizer_streams() {
    for (cudaStream_t s : {opt_in_stream_, opt_out_stream_})
        if (s) cudaStreamSynchronize(s);
    for (cudaEvent_t e : {opt_start_, opt_in_done_[0], opt_in_done_[1], opt_computed_[0], opt_computed_[1],
                          opt_out_done_[0], opt_out_done_[1]})
        if (e) cudaEventDestroy(e);
    for (cudaStream_t s : {opt_in_stream_, opt_out_stream_})
        if (s) cudaStreamDestroy(s);
}

void CudaModel::run_adamw(const cuda::AdamWArgs& args, float* weight_amax) {
    const auto* segs = static_cast<const cuda::ParamSegment*>(buf_.segments);
    void* weights = buf_.weights == buf_.master ? nullptr : buf_.weights;
    if (!opt_staged_) {
        cuda::adamw_update(segs, buf_.num_segments, layout_.total, buf_.master, buf_.grads, opt_.param_grad_dtype,
                           buf_.adam_m, opt_.opt_m_dtype, buf_.adam_v, opt_.opt_v_dtype, weights, opt_.model_dtype,
                           buf_.norm_out, args, weight_amax, stream_);
        return;
    }
    // the arrays in kOpt* order, their element types, whether AdamW reads / writes them
    void* const base[5] = {buf_.master, buf_.grads, buf_.adam_m, buf_.adam_v, weights};
    const DType type[5] = {DType::F32, opt_.param_grad_dtype, opt_.opt_m_dtype, opt_.opt_v_dtype, opt_.model_dtype};
    const bool reads[5] = {true, true, true, true, buf_.master == nullptr};  // bf16 master: weights are read
    const bool writes[5] = {true, false, true, true, true};
    // the host arrays are complete once everything queued on stream_ so far is (the gradient flushes
    // were joined into it by wait_for_gradients)
    CUDA_CHECK(cudaEventRecord(opt_start_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(opt_in_stream_, opt_start_, 0));
    const int64_t P = layout_.total, C = buf_.opt_chunk;
    for (int64_t begin = 0, k = 0; begin < P; begin += C, ++k) {
        const int s = static_cast<int>(k & 1);
        const int64_t n = std::min(C, P - begin);
        void* at[5];
        CUDA_CHECK(cudaStreamWaitEvent(opt_in_stream_, opt_out_done_[s], 0));  // slot s written back
        for (int a = 0; a < 5; ++a) {
            const std::size_t es = dtype_size(type[a]);
            char* host = base[a] ? static_cast<char*>(base[a]) + begin * es : nullptr;
            if (!buf_.opt_stage[a][s]) {  // on the device: used in place
                at[a] = host;
                continue;
            }
            at[a] = buf_.opt_stage[a][s];
            if (reads[a])
                CUDA_CHECK(cudaMemcpyAsync(at[a], host, n * es, cudaMemcpyHostToDevice, opt_in_stream_));
        }
        CUDA_CHECK(cudaEventRecord(opt_in_done_[s], opt_in_stream_));
        CUDA_CHECK(cudaStreamWaitEvent(stream_, opt_in_done_[s], 0));
        cuda::adamw_update_range(segs, buf_.num_segments, begin, begin + n, static_cast<float*>(at[kOptMaster]),
                                 at[kOptGrads], opt_.param_grad_dtype, at[kOptM], opt_.opt_m_dtype, at[kOptV],
                                 opt_.opt_v_dtype, at[kOptWeights], opt_.model_dtype, buf_.norm_out, args, weight_amax,
                                 stream_);
        CUDA_CHECK(cudaEventRecord(opt_computed_[s], stream_));
        CUDA_CHECK(cudaStreamWaitEvent(opt_out_stream_, opt_computed_[s], 0));
        for (int a = 0; a < 5; ++a) {
            if (!buf_.opt_stage[a][s] || !writes[a] || !base[a]) continue;
            const std::size_t es = dtype_size(type[a]);
            CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(base[a]) + begin * es, at[a], n * es,
                                       cudaMemcpyDeviceToHost, opt_out_stream_));
        }
        CUDA_CHECK(cudaEventRecord(opt_out_done_[s], opt_out_stream_));
    }
    // what follows on stream_ (weight refresh, gradient zeroing, the next step) sees the updated host
    // state; the out stream is serial, so its last event covers every chunk
    CUDA_CHECK(cudaStreamWaitEvent(stream_, opt_out_done_[((P + C - 1) / C - 1) & 1], 0));
}

}  // namespace qtrain
