// The training step of the GPU model: batch upload, forward, LM head + loss, backward (with the
// recompute flags and CUDA graph capture), the optimizer step, evaluation and logits. The passes walk
// the layer program (layer_program.h); each step's math and the roles' per-layer calls are
// cuda_model_layer.cpp's.
#include "model/cuda/cuda_model.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "model/flag_names.h"
#include "cuda/attention_ragged.h"
#include "cuda/check.h"
#include "cuda/fp8.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "model/cpu/cpu_ops.h"

namespace qtrain {

// Batch::positions must be what imodel.h says (each row a run of documents, each counting 0, 1, 2, ...):
// the attention kernels find a document's keys from them and trust that form (attention.h).
static void check_document_positions(const int32_t* positions, int B, int T) {
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t) {
            const int32_t p = positions[static_cast<int64_t>(b) * T + t];
            const bool ok = t == 0 ? p == 0 : (p == 0 || p == positions[static_cast<int64_t>(b) * T + t - 1] + 1);
            QT_CHECK(ok, "GPU model: Batch::positions at row ", b, ", token ", t, " is ", p, "; expected 0 (a new ",
                     "document)", t == 0 ? "" : " or the previous position + 1",
                     " (documents are contiguous runs 0, 1, 2, ...)");
        }
}

void CudaModel::upload_batch(const Batch& batch, bool with_embedding_plan, float loss_scale, float grad_dscale) {
    const int B = batch.batch_size, T = batch.seq_len;
    QT_CHECK(B == opt_.batch_size && T == opt_.seq_len, "GPU model: batch of ", B, "x", T,
             " does not match the planned ", flag(&ModelOptions::batch_size), "=", opt_.batch_size, " ",
             flag(&ModelOptions::seq_len), "=", opt_.seq_len);
    QT_CHECK(!batch.positions || opt_.document_masking,
             "GPU model: the batch carries document positions (packed rows) but the model was built without "
             "document masking (", flag(&ModelOptions::document_masking), ")");
    QT_CHECK(batch.positions || !opt_.document_masking, "GPU model: built with ", flag(&ModelOptions::document_masking),
             ", but the batch carries no document positions (Batch::positions)");
    if (batch.positions) check_document_positions(batch.positions, B, T);
    if (batch.positions && attention_ == AttentionBackend::Cudnn) {  // cuDNN's ragged batch has fixed slots
        const int docs = cuda::max_documents_per_row(batch.positions, B, T);
        QT_CHECK(docs <= opt_.max_docs_per_row, "GPU model: a row of this micro-batch holds ", docs,
                 " documents, more than ", flag(&ModelOptions::max_docs_per_row), "=", opt_.max_docs_per_row,
                 " (cuDNN's variable-length attention has that many slots per row); raise it, or use ",
                 flag(&ModelOptions::attention), "=flash");
    }
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
    if (opt_.document_masking) {  // into the fixed buffer that RoPE and attention read (graph-safe)
        int32_t* h_doc = st + 5 * N + 5;  // after the 4 scalar slots (gpu_buffers.h)
        std::memcpy(h_doc, batch.positions, N * sizeof(int32_t));
        CUDA_CHECK(cudaMemcpyAsync(buf_.doc_positions, h_doc, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    }
    if (with_embedding_plan) {
        // group positions by token (stable: increasing position within a token) for the
        // deterministic embedding backward; the pad token's positions (HF's padding_idx) sort last
        // and belong to no group, so its row gets no gradient from the lookup
        const int32_t pad = config_.pad_token_id;
        auto key = [&](int i) { return batch.inputs[i] == pad ? INT32_MAX : batch.inputs[i]; };
        std::vector<int32_t> order(N);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) < key(b); });
        const int grouped = static_cast<int>(
            std::find_if(order.begin(), order.end(), [&](int i) { return batch.inputs[i] == pad; }) - order.begin());
        int u = 0;
        for (int i = 0; i < N; ++i) {
            h_pos[i] = order[i];
            if (i >= grouped) continue;
            if (i == 0 || batch.inputs[order[i]] != batch.inputs[order[i - 1]]) {
                h_unique[u] = batch.inputs[order[i]];
                h_off[u] = i;
                ++u;
            }
        }
        h_off[u] = grouped;
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

// The forward: the embedding, then each layer's program (layer_program.h), then the final norm,
// which adds the last layer's output to the residual. A layer's InputNorm adds the previous layer's
// output (that layer ends there); the roles' calls between are cuda_model_layer.cpp's.
void CudaModel::forward(int B, int T, bool for_backward) {
    keep_xT_ = for_backward;
    lora_training_ = for_backward;
    const BlockDims d = block_dims(B, T);
    const int L = config_.num_hidden_layers;
    auto W = [&](int64_t off) { return weights_->at(off); };

    forward_begin();
    {
        auto t_ = timer_.scope("embedding", stream_);
        cuda::embedding_forward(opt_.model_dtype, buf_.layers[0].res_in, buf_.inputs, W(layout_.embed), d.N, d.h,
                                stream_);
    }
    for (int l = 0; l < L; ++l) {
        layer_enter(l, Pass::Forward);
        for (const LayerStep& s : program_.steps) {
            forward_step(l, s, StepRun::Forward, d);
            if (has(s.writes, Act::ResIn)) layer_input_written(l);  // (the residual offload saves it)
        }
    }
    {
        auto t_ = timer_.scope("rmsnorm fwd", stream_);
        cuda::residual_rmsnorm_forward(opt_.model_dtype, buf_.res_final, buf_.xf, buf_.rstd_final,
                                       buf_.layers[L - 1].res_mid, buf_.tmp_h, W(layout_.final_norm), d.N, d.h,
                                       d.eps, stream_, nullptr);
    }
    layer_exit(L - 1, Pass::Forward);
    keep_xT_ = false;
    lora_training_ = false;
}

// --lm-head-dtype=e4m3: the final norm's output quantised once for all chunks (one per-tensor scale,
// like a layer's input), into xq.
void CudaModel::lm_head_quantize_input(int N) {
    if (!opt_.fp8_lm_head) return;
    const int L = config_.num_hidden_layers;
    auto t_ = timer_.scope("fp8 quantize", stream_);
    float* xa = fp8_slot_ptr(fp8_head_slot(L, Fp8HeadSlot::XAmax));
    const int64_t n = static_cast<int64_t>(N) * config_.hidden_size;
    cuda::abs_max(xa, opt_.model_dtype, buf_.xf, n, stream_);
    cuda::quantize_fp8(buf_.xq, DType::E4M3, buf_.xf, opt_.model_dtype, n, xa,
                       fp8_slot_ptr(fp8_head_slot(L, Fp8HeadSlot::XInv)), stream_);
}

// The logits of rows [r0, r0 + rows) into buf_.logits: a model-dtype GEMM, or with an FP8 LM head
// the quantised rows (lm_head_quantize_input) times the head's FP8 copy, bf16 out.
void CudaModel::lm_head_logits(int r0, int rows) {
    const DType A = opt_.model_dtype;
    const int h = config_.hidden_size, V = config_.vocab_size;
    auto t_ = timer_.scope("lm head gemm", stream_);
    if (!opt_.fp8_lm_head) {
        const void* x = static_cast<const char*>(buf_.xf) + static_cast<std::size_t>(r0) * h * dtype_size(A);
        gemm_->linear_forward(buf_.logits, A, x, weights_->at(layout_.lm_head), A, nullptr, rows, h, V, stream_);
        return;
    }
    const void* xq = static_cast<const char*>(buf_.xq) + static_cast<std::size_t>(r0) * h;
    gemm_->linear_forward_fp8(buf_.logits, A, xq, DType::E4M3,
                              fp8_slot_ptr(fp8_head_slot(config_.num_hidden_layers, Fp8HeadSlot::XInv)),
                              weights_->lm_head_q(), DType::E4M3, weights_->lm_head_inv_scale(), nullptr, rows, h, V,
                              stream_, 0.0f, opt_.fp8_fast_accum != Fp8FastAccum::Off);
}

// dx (into d_ln) and dW (accumulated) of the LM head for rows [r0, r0 + rows) from their d(logits)
// in buf_.logits. With an FP8 LM head and FP8 gradients both run in FP8 as linear_bwd does: d(logits)
// quantised (and transposed) with this chunk's own amax and scale -- a chunk is all the gradient
// there is at a time, so each gets its own, as the CPU emulation does -- x's rows quantised
// transposed with the forward's scale (the codes the forward used), W^T from the head's FP8 copy.
// Otherwise both in the model dtype from the bf16 weights and activations, as before.
void CudaModel::lm_head_backward(int r0, int rows) {
    const DType A = opt_.model_dtype;
    const int h = config_.hidden_size, V = config_.vocab_size, L = config_.num_hidden_layers;
    const std::size_t es = dtype_size(A);
    const void* x = static_cast<const char*>(buf_.xf) + static_cast<std::size_t>(r0) * h * es;
    void* dx = static_cast<char*>(buf_.d_ln) + static_cast<std::size_t>(r0) * h * es;
    // (LoRA: the head is frozen, unless --train-also=embeddings trains it: the adapters' fp32 gradient)
    float* dw = frozen_base() ? param_grad(layout_.lm_head) : grads_->at(layout_.lm_head);
    if (!(opt_.fp8_lm_head && fp8_grads_)) {
        const void* w = weights_->at(layout_.lm_head);
        {
            auto t_ = timer_.scope("lm head gemm", stream_);
            gemm_->linear_backward_input(dx, A, buf_.logits, w, A, rows, h, V, stream_);
        }
        if (dw) {
            auto t_ = timer_.scope("lm head gemm", stream_);
            gemm_->linear_backward_weight(dw, DType::F32, buf_.logits, x, A, rows, h, V, true, stream_);
        }
        return;
    }
    const DType gd = opt_.gradient_dtype;
    float* ga = fp8_slot_ptr(fp8_head_slot(L, Fp8HeadSlot::GradAmax));
    float* gi = fp8_slot_ptr(fp8_head_slot(L, Fp8HeadSlot::GradInv));
    {
        auto t_ = timer_.scope("fp8 quantize", stream_);
        cuda::abs_max(ga, A, buf_.logits, static_cast<int64_t>(rows) * V, stream_);
        if (dw) {  // (the dW GEMM's operands)
            cuda::quantize_fp8_transpose(buf_.lm_dyTq, gd, buf_.logits, A, rows, V, ga, gi, stream_, buf_.lm_dyq);
            cuda::quantize_fp8_transpose(buf_.xTq, DType::E4M3, x, A, rows, h,
                                         fp8_slot_ptr(fp8_head_slot(L, Fp8HeadSlot::XAmax)), nullptr, stream_);
        } else {  // (LoRA's frozen head: no d(logits)^T, none allocated; the same row-major codes)
            cuda::quantize_fp8(buf_.lm_dyq, gd, buf_.logits, A, static_cast<int64_t>(rows) * V, ga, gi, stream_);
        }
    }
    // Never fast accumulation here, whatever --fp8-fast-accum says: on 300 KJV steps (H200, demo model,
    // vocab 152k) the head's backward with fast accumulation ended 3.0% above bf16's eval loss (one
    // LM-head chunk: dW sums 8,192 tokens' d(logits), mostly tiny softmax terms, in Hopper's reduced
    // fast-accumulation precision; four chunks of 2,048 did not show it), with exact accumulation 1.5%
    // below it -- docs/benchmarks.md, "FP8 LM head".
    constexpr bool fast = false;
    {
        auto t_ = timer_.scope("lm head gemm", stream_);
        gemm_->linear_backward_input_fp8(dx, A, buf_.lm_dyq, gd, gi, weights_->lm_head_qT(), DType::E4M3,
                                         weights_->lm_head_inv_scale(), rows, h, V, stream_, 0.0f, fast);
    }
    if (!dw) return;  // (LoRA: the frozen head's input gradient only)
    auto t_ = timer_.scope("lm head gemm", stream_);
    gemm_->linear_backward_weight_fp8(dw, DType::F32, buf_.lm_dyTq, gd, gi, buf_.xTq, DType::E4M3,
                                      fp8_slot_ptr(fp8_head_slot(L, Fp8HeadSlot::XInv)), rows, h, V, true, stream_,
                                      fast);
}

void CudaModel::lm_head(int N, float* loss_acc, bool with_grads) {
    const DType A = opt_.model_dtype;
    const int V = config_.vocab_size;
    lm_head_quantize_input(N);
    for (int r0 = 0; r0 < N; r0 += buf_.lmhead_chunk_rows) {
        const int rows = std::min(buf_.lmhead_chunk_rows, N - r0);
        lm_head_logits(r0, rows);
        {
            auto t_ = timer_.scope("cross entropy", stream_);
            cuda::softmax_cross_entropy(A, buf_.logits, buf_.losses + r0, buf_.targets + r0, rows, V,
                                        buf_.step_scalars + 1, with_grads, stream_);
        }
        if (with_grads) lm_head_backward(r0, rows);
    }
    {
        auto t_ = timer_.scope("cross entropy", stream_);
        cuda::accumulate_loss(loss_acc, buf_.losses, N, buf_.step_scalars, stream_);
    }
}

// The backward: the final norm's, then each layer from the top: its recompute (the program's steps
// the --recompute-* flags select), then its steps' gradients in reverse order; then the embedding's.
void CudaModel::backward(int B, int T) {
    const DType A = opt_.model_dtype;
    const BlockDims d = block_dims(B, T);
    const int N = d.N, h = d.h, L = config_.num_hidden_layers;
    const std::size_t es = dtype_size(A);
    auto W = [&](int64_t off) { return weights_->at(off); };
    auto G = [&](int64_t off) { return param_grad(off); };
    lora_training_ = true;  // the recompute re-runs the training forward's adapters, dropout included

    // final norm: d_res = d(res_final) from d(xf) (held in d_ln by lm_head)
    CUDA_CHECK(cudaMemsetAsync(buf_.d_res, 0, static_cast<std::size_t>(N) * h * es, stream_));
    {
        auto t_ = timer_.scope("rmsnorm bwd", stream_);
        cuda::rmsnorm_backward(A, buf_.d_res, G(layout_.final_norm), buf_.col_scratch, buf_.d_ln, buf_.res_final,
                               W(layout_.final_norm), buf_.rstd_final, N, h, stream_, grad_amax());
    }
    for (int l = L - 1; l >= 0; --l) {
        layer_enter(l, Pass::Backward);
        recompute_layer(l, d);
        for (auto s = program_.steps.rbegin(); s != program_.steps.rend(); ++s) backward_step(l, *s, d);
        layer_exit(l, Pass::Backward);
    }
    lora_training_ = false;
    // (LoRA: the embedding is frozen, unless --train-also=embeddings trains it: the adapters' fp32 gradient)
    if (!frozen_base() || param_grad(layout_.embed)) {
        auto t_ = timer_.scope("embedding", stream_);
        const int32_t* num_unique = reinterpret_cast<const int32_t*>(buf_.step_scalars + 2);
        if (!frozen_base() && grads_->embedding_on_host()) {  // straight into the pinned host copy (bf16: rounded like the layers' flushes)
            const DType gt = opt_.param_grad_dtype;
            void* table = static_cast<char*>(grads_->flat()) + layout_.embed * dtype_size(gt);
            cuda::embedding_backward(table, gt, A, buf_.d_res, buf_.emb_unique, buf_.emb_offsets, buf_.emb_positions,
                                     num_unique, N, h, stream_, static_cast<uint64_t>(layout_.embed),
                                     grads_->rounding_seed());
        } else {
            cuda::embedding_backward(G(layout_.embed), DType::F32, A, buf_.d_res, buf_.emb_unique, buf_.emb_offsets,
                                     buf_.emb_positions, num_unique, N, h, stream_);
        }
    }
    grads_->end_backward();
}

void CudaModel::forward_backward_ops(int B, int T) {
    forward(B, T, true);
    lm_head(B * T, buf_.loss_acc, true);
    backward(B, T);
    // CUDA graphs: the pass ends with the roles' side streams joined (a capture must), eager or not
    if (opt_.use_cuda_graphs) join_side_streams();
}

// The residual offload's copies and the offloaded gradients' flushes run on the roles' own streams;
// here the compute stream waits for everything queued on them and their events are settled
// (cuda/pass_event.h). Under CUDA graphs: before each captured pass or replay (eager), so the graph's
// copies do not race with earlier ones and the capture waits on no event recorded outside it, and at
// the end of each pass (inside the capture), which a capture must end with.
void CudaModel::join_side_streams() {
    residuals_->join();
    grads_->join();
    weights_->join();  // weight streaming's copies (and quantisation) of the layers
}

void CudaModel::forward_backward(const Batch& batch, float grad_scale) {
    forward_backward_pass(batch, grad_scale);
    // LoRA: the pass has ended (outside any captured graph): the next one draws new dropout masks
    if (lora_) lora_->end_pass();
}

void CudaModel::forward_backward_pass(const Batch& batch, float grad_scale) {
    const int B = batch.batch_size, T = batch.seq_len, N = B * T;
    const int valid = cpu::count_valid_targets(batch.targets, N);
    const float denominator = batch.loss_denominator > 0.0f ? batch.loss_denominator : static_cast<float>(valid);
    const float dscale = valid ? grad_scale / denominator : 0.0f;  // Batch::loss_denominator: the step's count
    upload_batch(batch, true, dscale, dscale);
    if (valid == 0) {  // nothing to learn from: no loss, no gradient
        if (!grads_->reduced_per_layer() && !weights_->sharded()) {
            forward(B, T);
            return;
        }
        // ZeRO-2's per-layer reductions and ZeRO-3's gathers are collectives in the backward that
        // every rank must join: run it with zero scales (it adds zeros to the gradient)
        forward_backward_ops(B, T);
        return;
    }
    // The per-op timer records events between ops, which a graph would hide: it runs eagerly.
    // --gemm-autotune tries algorithms on real calls, which a captured graph would freeze: the step
    // runs eagerly until every GEMM shape is decided (or for at most 64 micro-batches).
    const bool tuning = opt_.gemm_autotune && graphs_.empty() && eager_tuning_calls_ < 64 &&
                        (gemm_->cached_shapes() == 0 || gemm_->tuning_stats().shapes_exploring > 0);
    if (!opt_.use_cuda_graphs || timer_.enabled() || tuning) {
        if (tuning) ++eager_tuning_calls_;
        forward_backward_ops(B, T);
        return;
    }
    join_side_streams();  // (outside the capture: see there)
    // Weight streaming decides its copies on the host from the slots' state (weights.h): a graph is
    // captured per state a pass starts from, and a replay leaves the state its capture left.
    const Weights::StreamState start = weights_->stream_state();
    auto it = std::find_if(graphs_.begin(), graphs_.end(), [&](const CapturedPass& g) { return g.start == start; });
    if (it == graphs_.end()) {
        // Capture. Every pointer and shape is fixed by the plan, and everything that changes per
        // micro-batch (tokens, the embedding grouping, the scales, whether the offloaded gradient's
        // flushes copy or add) is read from device memory that upload_batch (and the gradient role)
        // refresh before each launch. The side streams' work is forked into the capture by events
        // and joined back at its end (join_side_streams).
        CapturedPass g;
        g.start = start;
        CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        try {
            weights_->begin_captured_pass();
            forward_backward_ops(B, T);
        } catch (...) {
            cudaGraph_t partial = nullptr;
            cudaStreamEndCapture(stream_, &partial);
            if (partial) cudaGraphDestroy(partial);
            throw;
        }
        CUDA_CHECK(cudaStreamEndCapture(stream_, &g.graph));
        if (const cudaError_t e = cudaGraphInstantiate(&g.exec, g.graph, 0); e != cudaSuccess) {
            cudaGraphDestroy(g.graph);
            CUDA_CHECK(e);
        }
        g.end = weights_->stream_state();
        graphs_.push_back(std::move(g));
        it = graphs_.end() - 1;
    }
    CUDA_CHECK(cudaGraphLaunch(it->exec, stream_));
    weights_->replayed(it->end);  // (the slots as the capture left them; events after the graph)
    grads_->backward_replayed();  // (the host-side bookkeeping that ran only at capture)
}

StepStats CudaModel::optimizer_step(const OptimizerParams& p) {
    if (lora_) return lora_optimizer_step(p);
    StepStats stats;
    bool updated = false;
    // FP8 with resident weights: AdamW computes the weights' abs-max as it writes them (streamed
    // layers are quantised, amax included, as they arrive instead); a rank that updates only its block
    // sees only its part, so the quantisation measures it after the gather
    const bool fused_amax = weights_->amax_from_update() && shard_.world == 1;
    {
        auto t_ = timer_.scope("optimizer", stream_);
        grads_->prepare_update();
        const int K = cuda::norm_partials_count();
        if (comm_) {
            reduce_gradients();  // this rank's block summed over the ranks, every rank's partials
        } else {
            cuda::sum_squares_partials(buf_.norm_partials, buf_.grads, opt_.param_grad_dtype, layout_.total, stream_);
        }
        cuda::norm_from_partials(buf_.norm_out, buf_.norm_partials, K * shard_.world, p.grad_clip, stream_);
        // The norm and the loss come back before AdamW is queued, so a broken step (non-finite, or a
        // zero norm) writes nothing (imodel.h). The wait costs one round trip per step (~10 us of a
        // step of 100+ ms): AdamW is queued after the backward has drained instead of behind it.
        float norm = 0;
        CUDA_CHECK(cudaMemcpyAsync(&norm, buf_.norm_out, sizeof(float), cudaMemcpyDeviceToHost, stream_));
        stats = StepStats{global_loss(), norm};  // (waits for the stream)
        updated = update_allowed(stats);
        if (updated) {
            cuda::AdamWArgs args{p.learning_rate, p.beta1, p.beta2, p.epsilon, p.weight_decay, p.step, sr_seed_};
            if (fused_amax) zero(weights_->amax_slots(), weights_->amax_bytes());
            // the arrays at this rank's first element (the whole space on one GPU); a block master
            // and the moments start there
            const int64_t b = shard_.begin;
            float* master = !buf_.master ? nullptr : master_is_block() ? buf_.master : buf_.master + b;
            const void* grads = grads_->reduced_per_layer()
                                    ? buf_.grads  // ZeRO-2: the block itself
                                    : static_cast<const char*>(buf_.grads) + b * dtype_size(opt_.param_grad_dtype);
            void* weights = buf_.weights == buf_.master ? nullptr
                            : weights_->sharded()       ? buf_.weights  // ZeRO-3: the block itself
                                : static_cast<char*>(buf_.weights) + b * dtype_size(opt_.model_dtype);
            optimizer_->update(args, {master, grads, weights}, b, shard_.end, buf_.norm_out,
                               fused_amax ? weights_->amax_slots() : nullptr, stream_);
            // ZeRO-3 keeps the block: the layers are gathered as they are used, the resident
            // weights by changed() below
            if (comm_ && !weights_->sharded()) gather_weights();
        }
        grads_->finish_update();
    }
    if (updated) {
        weights_->changed();
        weights_->quantize(fused_amax);
    }
    sync();
    timer_.collect();  // every scope of this step has ended (the optimizer's block above)
    return stats;
}

// LoRA: the adapters (and --train-also's tensors, in the same flat space) are all there is to train.
// Their one norm is clipped (the CPU model's CpuLora::grad_sum_squares), and as for the full model a
// broken step writes nothing (imodel.h). With several ranks each rank's block of their gradient is
// summed over the ranks (ZeRO-1: all-reduced, ZeRO-2: reduce-scattered), the blocks' partial norms
// are combined in one order on every rank, AdamW updates the block and the weights are all-gathered
// (lora_adapters.h); the update then writes --train-also's values into the base's weights.
StepStats CudaModel::lora_optimizer_step(const OptimizerParams& p) {
    StepStats stats;
    {
        auto t_ = timer_.scope("optimizer", stream_);
        lora_->reduce_and_sum_squares(buf_.norm_partials);
        cuda::norm_from_partials(buf_.norm_out, buf_.norm_partials, cuda::norm_partials_count() * lora_->shard().world,
                                 p.grad_clip, stream_);
        float norm = 0;
        CUDA_CHECK(cudaMemcpyAsync(&norm, buf_.norm_out, sizeof(float), cudaMemcpyDeviceToHost, stream_));
        stats = StepStats{global_loss(), norm};  // (waits for the stream)
        if (update_allowed(stats))
            lora_->update({p.learning_rate, p.beta1, p.beta2, p.epsilon, p.weight_decay, p.step, sr_seed_},
                          buf_.norm_out);
        else
            lora_->zero_grads();
    }
    sync();
    timer_.collect();
    return stats;
}

void CudaModel::zero_gradients() {
    if (!lora_) return IModel::zero_gradients();  // (the full model's gradient buffers: not yet; it throws)
    lora_->zero_grads();
    CUDA_CHECK(cudaMemsetAsync(buf_.loss_acc, 0, sizeof(float), stream_));  // the step loss (global_loss)
    sync();
}

std::vector<float> CudaModel::logits(const Batch& batch) {
    const int N = batch.batch_size * batch.seq_len, V = config_.vocab_size;
    const DType A = opt_.model_dtype;
    upload_batch(batch, false, 0.0f, 0.0f);
    forward(batch.batch_size, batch.seq_len);
    std::vector<float> out(static_cast<std::size_t>(N) * V);
    float* chunk_f32 = nullptr;
    CUDA_CHECK(cudaMalloc(&chunk_f32, static_cast<std::size_t>(buf_.lmhead_chunk_rows) * V * sizeof(float)));
    lm_head_quantize_input(N);
    for (int r0 = 0; r0 < N; r0 += buf_.lmhead_chunk_rows) {
        const int rows = std::min(buf_.lmhead_chunk_rows, N - r0);
        lm_head_logits(r0, rows);
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
    if (valid == 0 && !weights_->sharded()) return 0.0f;
    // (ZeRO-3: the forward's gathers are collectives, so a batch without targets still runs it)
    upload_batch(batch, false, valid ? 1.0f / static_cast<float>(valid) : 0.0f, 0.0f);
    forward(batch.batch_size, batch.seq_len);
    if (valid == 0) {
        sync();
        return 0.0f;
    }
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
