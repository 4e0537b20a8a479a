#include "model/cuda/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>

#include "core/error.h"
#include "model/cuda/attention_choice.h"
#include "core/files.h"
#include "cuda/attention.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/gemm.h"
#include "cuda/fp8.h"
#include "cuda/kernels.h"
#include "cuda/pinned_memory.h"
#include "io/flat_state_reader.h"
#include "io/safetensors.h"
#include "model/checkpoint_layout.h"
#include "model/cpu/cpu_ops.h"
#include "model/flag_names.h"
#include "model/hf_writer.h"
#include "model/parameters.h"

namespace qtrain {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// construction, options, plan
// ---------------------------------------------------------------------------------------------

void CudaModel::check_options(const ModelOptions& o) {
    if (o.lora.enabled()) check_lora_streaming(o);  // (first: the general --shard-weights checks assume a full model)
    QT_CHECK(o.model_dtype == DType::F32 || o.model_dtype == DType::BF16, flag(&ModelOptions::model_dtype), "=",
             dtype_name(o.model_dtype), " is not supported on ", flag(RunFlag::Device), "=cuda (fp32 or bf16)");
    const bool fp8 = o.matmul_dtype == DType::E4M3;
    QT_CHECK(o.matmul_dtype == o.model_dtype || (fp8 && o.model_dtype == DType::BF16),
             flag(&ModelOptions::matmul_dtype), "=", dtype_name(o.matmul_dtype), " is not supported on ",
             flag(RunFlag::Device), "=cuda with ", flag(&ModelOptions::model_dtype), "=", dtype_name(o.model_dtype),
             " (use the model dtype, or e4m3 with bf16)");
    QT_CHECK(o.gradient_dtype == o.model_dtype || (fp8 && is_fp8(o.gradient_dtype)),
             flag(&ModelOptions::gradient_dtype), "=", dtype_name(o.gradient_dtype), " is not supported on ",
             flag(RunFlag::Device), "=cuda with ", flag(&ModelOptions::matmul_dtype), "=", dtype_name(o.matmul_dtype),
             " (use the model dtype, or e4m3|e5m2 with ", flag(&ModelOptions::matmul_dtype), "=e4m3)");
    QT_CHECK(o.master_dtype == DType::F32 || (o.master_dtype == DType::BF16 && o.model_dtype == DType::BF16),
             flag(&ModelOptions::master_dtype), "=", dtype_name(o.master_dtype), " needs ",
             flag(&ModelOptions::model_dtype), "=bf16 on ", flag(RunFlag::Device), "=cuda (fp32 or bf16)");
    QT_CHECK(!(o.offload_master && o.master_dtype == DType::BF16), flag(&ModelOptions::offload_master), " with ",
             flag(&ModelOptions::master_dtype),
             "=bf16: there is no separate master copy to offload (the bf16 weights are the master); drop ",
             flag(&ModelOptions::offload_master), ", or add ", flag(&ModelOptions::shard_weights),
             " to keep the weights in host memory");
    QT_CHECK(o.param_grad_dtype == DType::F32 || o.param_grad_dtype == DType::BF16,
             flag(&ModelOptions::param_grad_dtype), "=", dtype_name(o.param_grad_dtype), " on ", flag(RunFlag::Device),
             "=cuda: fp32 or bf16");
    QT_CHECK(!o.offload_master || o.model_dtype != DType::F32, flag(&ModelOptions::offload_master), " needs ",
             flag(&ModelOptions::model_dtype), "=bf16 (in fp32 the master copy is the weights the GEMMs read)");
    QT_CHECK(!o.write_combined || o.offload_master || o.offload_opt_m || o.offload_opt_v || o.offload_gradients ||
                 o.shard_weights,
             flag(&ModelOptions::write_combined), " applies to offloaded buffers: add ",
             flag(&ModelOptions::offload_master), ", ", flag(&ModelOptions::offload_opt_m), ", ",
             flag(&ModelOptions::offload_opt_v), ", ", flag(&ModelOptions::offload_gradients), " or ",
             flag(&ModelOptions::shard_weights));
    QT_CHECK(!o.offload_double_buffer || o.offload_master || o.offload_opt_m || o.offload_opt_v ||
                 o.offload_gradients || o.shard_weights,
             flag(&ModelOptions::offload_double_buffer), " applies to offloaded optimizer inputs: add ",
             flag(&ModelOptions::offload_master), ", ", flag(&ModelOptions::offload_opt_m), ", ",
             flag(&ModelOptions::offload_opt_v), ", ", flag(&ModelOptions::offload_gradients), " or ",
             flag(&ModelOptions::shard_weights));
    QT_CHECK(o.optimizer_chunk >= 64 && o.optimizer_chunk % 64 == 0, "optimizer chunk of ", o.optimizer_chunk,
             " elements: must be a positive multiple of 64");
    // Resident FP8 weights are always quantised once per optimizer step and kept (wq, and wTq unless
    // --fp8-weight-transposes=jit), so
    // --persistent-quants only changes streamed layers, whose backward then reads the transposed copy
    // made on the device from the kept one: that needs FP8 gradients (a bf16 backward reads the bf16
    // weight matrices, which a persistent-quants pass no longer copies in).
    QT_CHECK(!(o.persistent_quants || o.offload_quants) || fp8,
             o.offload_quants ? flag(&ModelOptions::offload_quants) : flag(&ModelOptions::persistent_quants),
             " keeps FP8 weight copies: it needs ", flag(&ModelOptions::matmul_dtype), "=e4m3");
    QT_CHECK(!o.offload_quants || o.shard_weights, flag(&ModelOptions::offload_quants),
             " puts the FP8 copies of streamed layers in pinned host memory: it needs ",
             flag(&ModelOptions::shard_weights),
             " (without it the FP8 copies are resident, quantised once per step, and need no offload)");
    QT_CHECK(!(o.persistent_quants || o.offload_quants) || !o.shard_weights || is_fp8(o.gradient_dtype),
             o.offload_quants ? flag(&ModelOptions::offload_quants) : flag(&ModelOptions::persistent_quants), " with ",
             flag(&ModelOptions::shard_weights), " needs ", flag(&ModelOptions::gradient_dtype),
             "=e4m3|e5m2 (the backward then reads only FP8 weight copies; with bf16 gradients it reads the bf16 "
             "weights, which are streamed anyway)");
    QT_CHECK(!o.fp8_lm_head || fp8, flag(&ModelOptions::fp8_lm_head), "=e4m3 needs ", flag(&ModelOptions::matmul_dtype),
             "=e4m3 (the LM head joins the FP8 matmuls; it is not FP8 on its own)");
    // --fp8-weight-transposes=jit drops the kept Wᵀ copies, which exist only with FP8 gradients (a bf16
    // backward reads the bf16 weights); with LoRA's FP8 base it is what happens anyway.
    QT_CHECK(!o.fp8_transposes_jit || (fp8 && is_fp8(o.gradient_dtype)), flag(&ModelOptions::fp8_transposes_jit),
             "=jit needs ", flag(&ModelOptions::matmul_dtype), "=e4m3 and ", flag(&ModelOptions::gradient_dtype),
             "=e4m3|e5m2 (only FP8 gradients keep transposed e4m3 weight copies; without them there is nothing to "
             "transpose just in time): add them, or drop ", flag(&ModelOptions::fp8_transposes_jit));
    QT_CHECK(o.fp8_fast_accum == Fp8FastAccum::Off || fp8, flag(&ModelOptions::fp8_fast_accum),
             " applies to FP8 GEMMs: it needs ", flag(&ModelOptions::matmul_dtype), "=e4m3 (or drop it)");
    QT_CHECK(o.fp8_fast_accum != Fp8FastAccum::All || is_fp8(o.gradient_dtype), flag(&ModelOptions::fp8_fast_accum),
             "=all also covers the backward GEMMs, which are FP8 only with ", flag(&ModelOptions::gradient_dtype),
             "=e4m3|e5m2 (add that, or use ", flag(&ModelOptions::fp8_fast_accum), "=forward)");
    // On one GPU, sharding means streaming from host memory (the weights role, weights.h).
    QT_CHECK(!o.shard_weights || o.model_dtype == DType::BF16, flag(&ModelOptions::shard_weights), " needs ",
             flag(&ModelOptions::model_dtype), "=bf16 (it streams the bf16 weights from host memory)");
    QT_CHECK(!o.shard_gradients || o.offload_gradients || o.gpus > 1, flag(&ModelOptions::shard_gradients),
             " on one GPU streams the gradients to host memory: add ", flag(&ModelOptions::offload_gradients));
    // CUDA graphs replay a captured micro-batch: whatever the step decides on the host must be the
    // same in every micro-batch (or read on the device). The residual offload's copies and the
    // offloaded gradients' flushes are (residual_offload.h, gradients.h); weight streaming's depend on
    // what its slots hold, so a graph is captured per starting state (weights.h: StreamState). ZeRO-3's
    // layer gathers are NCCL broadcasts on the copy stream, which are not captured.
    QT_CHECK(!o.use_cuda_graphs || !o.shard_weights || o.gpus == 1, flag(&ModelOptions::use_cuda_graphs), " with ",
             flag(&ModelOptions::shard_weights), " needs ", flag(&ModelOptions::gpus),
             "=1 (ZeRO-3 gathers each layer from its owners by collectives on the weights' copy stream, which a "
             "graph does not capture); drop one of the two");
    QT_CHECK(!o.use_cuda_graphs || !o.offload_gradients || o.gpus == 1, flag(&ModelOptions::use_cuda_graphs), " with ",
             flag(&ModelOptions::offload_gradients), " needs ", flag(&ModelOptions::gpus), "=1 (under CUDA graphs the ",
             "gradient is reduced over the ranks after the backward, which NCCL cannot do in host memory)");
    QT_CHECK(o.attn_bwd_chunks >= 1 && o.batch_size % o.attn_bwd_chunks == 0, flag(&ModelOptions::attn_bwd_chunks), "=",
             o.attn_bwd_chunks, " must divide ", flag(&ModelOptions::batch_size), "=", o.batch_size,
             " (the attention backward runs over the micro-batch in that many equal chunks of sequences)");
    QT_CHECK(o.gpus >= 1, flag(&ModelOptions::gpus), "=", o.gpus, ": must be at least 1");
    // ZeRO-3 (--shard-weights with --gpus > 1, weights.h) gathers each layer's weights from their
    // owners and reduces its gradient to them as the backward produces it: it needs ZeRO-2's
    // per-layer reductions (a rank holds no whole copy to add a whole gradient to).
    // (LoRA: the frozen base has no gradient to shard; ZeRO-3 shards the adapters' as ZeRO-2 does)
    QT_CHECK(o.gpus == 1 || !o.shard_weights || o.lora.enabled() || gradients_reduced_per_layer(o),
             flag(&ModelOptions::shard_weights),
             " with ", flag(&ModelOptions::gpus), "=", o.gpus, " is ZeRO-3: it shards the gradients too (",
             flag(RunFlag::ZeroLevel), "=3, or add ", flag(&ModelOptions::shard_gradients), ")");
    // ZeRO-2 reduces each layer's device slot to its owner, which adds it into its block: in pinned
    // host memory with --offload-gradients. ZeRO-1 would all-reduce the host gradient, which NCCL
    // cannot read.
    QT_CHECK(o.gpus == 1 || !o.offload_gradients || o.shard_gradients, flag(&ModelOptions::offload_gradients), " with ",
             flag(&ModelOptions::gpus), "=", o.gpus, " needs ZeRO-2 (", flag(RunFlag::ZeroLevel),
             "=2): the ranks reduce the device slots of each layer to their owner's block in host memory; ZeRO-1 would "
             "all-reduce the whole host gradient");
    QT_CHECK(o.gpus == 1 || o.param_grad_dtype == DType::F32 || gradients_reduced_per_layer(o),
             flag(&ModelOptions::param_grad_dtype), "=", dtype_name(o.param_grad_dtype), " with ",
             flag(&ModelOptions::gpus), "=", o.gpus, " needs ZeRO-2 (", flag(RunFlag::ZeroLevel), "=2) without ",
             flag(&ModelOptions::use_cuda_graphs), ": the rank's block of the gradient is what is kept in bf16");
    QT_CHECK(o.gpus > 1 || !o.memcpy_all_gather, flag(&ModelOptions::memcpy_all_gather),
             " chooses the copy-engine communicator between ranks: it needs ", flag(&ModelOptions::gpus), " > 1");
    if (o.lora.enabled()) check_lora_options(o);
}

// --shard-weights under LoRA streams the frozen base from pinned host memory on one GPU: with FP8
// gradients the FP8 base's e4m3 codes (fp8_base_streamed, gpu_buffers.h), otherwise the bf16 base as
// the full model streams its weights (quantised on arrival with --matmul-dtype=e4m3). With several
// ranks it is ZeRO-3 of the frozen base (--zero-level=3): each rank keeps its block (of the bf16
// weights, or of the FP8 base's codes) and the layers are gathered from their owners (weights.h).
void CudaModel::check_lora_streaming(const ModelOptions& o) {
    if (!o.shard_weights) return;
    const std::string lora = cat(flag(&LoraOptions::rank), "=", o.lora.rank);
    // (--train-also: on one GPU the streamed bf16 base's trained tensors are written into its host copy
    // and the resident and slot copies refreshed after every write (bind_base's after_write:
    // Weights::changed); under ZeRO-3 each rank writes the part in its block and changed() sends the
    // trained non-layer tensors from their owners (set_base_block); the FP8 base keeps them resident,
    // whole on every rank)
    QT_CHECK(!o.persistent_quants && !o.offload_quants, lora, " with ", flag(&ModelOptions::shard_weights), " and ",
             o.offload_quants ? flag(&ModelOptions::offload_quants) : flag(&ModelOptions::persistent_quants),
             " is not supported on ", flag(RunFlag::Device),
             "=cuda: the streamed FP8 base (FP8 gradients) is kept as e4m3 codes in pinned host memory already "
             "(quantised once by the load); drop ",
             o.offload_quants ? flag(&ModelOptions::offload_quants) : flag(&ModelOptions::persistent_quants));
    QT_CHECK(!o.fp8_base_keep_transposed, "GPU model: the test-only fp8_base_keep_transposed layout is not streamed (",
             flag(&ModelOptions::shard_weights), ")");
}

// LoRA on the GPU (lora_adapters.h) so far: a frozen base in the model dtype (with
// --matmul-dtype=e4m3 also its FP8 copies, quantised once, which the base's GEMMs read: the FP8
// base; with FP8 gradients its layer matrices are kept only as those copies, fp8_base_only),
// resident, or with --shard-weights on one GPU streamed from host memory (check_lora_streaming); on
// each rank with --gpus=N: replicated, or with --zero-level=3 sharded over the ranks, with ZeRO-1/2 of
// the adapters (lora_adapters.h). The flags that move or keep state the frozen base does not have are
// refused by name.
void CudaModel::check_lora_options(const ModelOptions& o) {
    const std::string lora = cat(flag(&LoraOptions::rank), "=", o.lora.rank);
    const std::pair<ModelFlag, bool> refused[] = {
        {&ModelOptions::shard_gradients, o.shard_gradients && o.gpus <= 1},  // (ZeRO-2 of the adapters with ranks)
        {&ModelOptions::offload_master, o.offload_master},
        {&ModelOptions::offload_opt_m, o.offload_opt_m},
        {&ModelOptions::offload_opt_v, o.offload_opt_v},
        {&ModelOptions::offload_gradients, o.offload_gradients},
        {&ModelOptions::offload_double_buffer, o.offload_double_buffer},
        {&ModelOptions::write_combined, o.write_combined}};
    for (const auto& [key, on] : refused)
        QT_CHECK(!on, lora, " with ", flag(key), " is not yet supported on ", flag(RunFlag::Device),
                 "=cuda (the frozen base has no master, gradient or Adam moments to shard or offload; the adapters "
                 "are small: with several ranks each keeps its block of their optimizer state, ",
                 flag(RunFlag::ZeroLevel), "=1|2; on one GPU ", flag(&ModelOptions::shard_weights),
                 " streams the frozen base from host memory)");
    QT_CHECK(o.master_dtype == DType::F32, lora, " with ", flag(&ModelOptions::master_dtype), "=",
             dtype_name(o.master_dtype),
             ": the frozen base has no master copy and the adapters keep an fp32 one (leave ",
             flag(&ModelOptions::master_dtype), " out)");
    QT_CHECK(o.opt_m_dtype == DType::F32 && o.opt_v_dtype == DType::F32, lora, " with ",
             flag(&ModelOptions::opt_m_dtype), " / ", flag(&ModelOptions::opt_v_dtype),
             " other than fp32: the adapters keep fp32 moments (leave them out)");
    QT_CHECK(o.param_grad_dtype == DType::F32, lora, " with ", flag(&ModelOptions::param_grad_dtype), "=",
             dtype_name(o.param_grad_dtype), ": the frozen base has no gradient and the adapters keep an fp32 one "
             "(leave ", flag(&ModelOptions::param_grad_dtype), " out)");
}

// FP8 GEMMs need every dimension a multiple of 16 (cuBLASLt's FP8 alignment rules).
static void check_fp8_shapes(const ModelConfig& c, const ModelOptions& o) {
    const int64_t N = static_cast<int64_t>(o.batch_size) * o.seq_len;
    for (auto [what, v] : {std::pair<const char*, int64_t>{"batch-size x seq-len", N}, {"hidden_size", c.hidden_size},
                           {"q dim", c.q_dim()}, {"kv dim", c.kv_dim()}, {"intermediate_size", c.intermediate_size}})
        QT_CHECK(v % 16 == 0, flag(&ModelOptions::matmul_dtype), "=e4m3 needs ", what, " to be a multiple of 16 (got ",
                 v, ")");
    if (!o.fp8_lm_head) return;
    // the LM head's GEMMs: the vocabulary is a dimension of all three, a chunk's rows of the dW GEMM's sum
    QT_CHECK(c.vocab_size % 16 == 0, flag(&ModelOptions::fp8_lm_head),
             "=e4m3 needs vocab_size to be a multiple of 16 (got ", c.vocab_size, "); use ",
             flag(&ModelOptions::fp8_lm_head), "=bf16");
    const int64_t rows = (N + o.lmhead_chunks - 1) / o.lmhead_chunks;
    QT_CHECK(rows % 16 == 0, flag(&ModelOptions::fp8_lm_head),
             "=e4m3 needs the LM head's chunk of rows (batch-size x seq-len / ", flag(&ModelOptions::lmhead_chunks),
             "=", o.lmhead_chunks, ", rounded up: ", rows, ") to be a multiple of 16; choose another ",
             flag(&ModelOptions::lmhead_chunks));
}

MemoryPlan CudaModel::plan(const ModelConfig& config, const ModelOptions& options) {
    check_options(options);
    check_lora(config, options.lora);  // (a rank larger than a target's dimensions, ...)
    return gpu_memory_plan(config, options, "cuda");
}

CudaModel::CudaModel(const ModelConfig& config, const ModelOptions& options)
    : config_(config), opt_(options), layout_(make_gpu_layout(config)) {
    check_options(opt_);
    check_lora(config_, opt_.lora);  // (before any memory is taken)
    fp8_ = opt_.matmul_dtype == DType::E4M3;
    fp8_grads_ = fp8_ && is_fp8(opt_.gradient_dtype);
    if (fp8_) check_fp8_shapes(config_, opt_);
    program_ = make_layer_program(layout_);
    recompute_ = recompute_set(opt_);
    check_recompute(program_, recompute_);
    const int devices = cuda_device_count();
    QT_CHECK(devices > 0, flag(RunFlag::Device), "=cuda: no GPU is visible");
    QT_CHECK(opt_.device_index >= 0 && opt_.device_index < devices, "GPU ", opt_.device_index,
             " does not exist: this machine has ", devices, " visible GPU", devices == 1 ? "" : "s", " (",
             flag(RunFlag::GpuIds), ", CUDA_VISIBLE_DEVICES)");
    // the calling thread's device: a rank thread makes all of its model's CUDA calls on it
    CUDA_CHECK(cudaSetDevice(opt_.device_index));
    shard_ = param_shard(layout_.total, 1, 0);  // the whole space until set_communicator
    attention_ = choose_attention_backend(config_, opt_);
    const GpuInfo info = cuda_device_info(opt_.device_index);
    device_name_ = info.name;
    plan_ = gpu_memory_plan(config_, opt_, device_name_);
    QT_CHECK(plan_.total_device() <= info.free_memory, "the memory plan needs ", human_bytes(plan_.total_device()),
             " on the GPU but only ", human_bytes(info.free_memory), " are free on ", info.name, "; reduce ",
             flag(&ModelOptions::batch_size), " or ", flag(&ModelOptions::seq_len), ", raise ",
             flag(&ModelOptions::lmhead_chunks), ", or use recompute/offload flags");

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
            cuda::PinnedBlock block = cuda::pinned_alloc(bytes, wc, a.category.c_str());
            p = block.ptr;
            a.registered = block.registered;
        } else {
            CUDA_CHECK(cudaMalloc(&p, bytes));
        }
        a.base = static_cast<char*>(p);
        a.allocated = bytes;
    }
    bind_gpu_buffers(buf_, arenas_, config_, opt_, layout_);

    stream_ = cuda::Stream::non_blocking();
    staging_free_ = cuda::Event::ordering();
    CUDA_CHECK(cudaEventRecord(staging_free_, stream_));
    create_roles();
    gemm_ = std::make_unique<GemmRunner>(kGemmWorkspaceBytes, opt_.gemm_autotune);
    if (frozen_base())  // the adapters (from the seed until init_random / load_hf start them again)
        lora_ = std::make_unique<LoraAdapters>(buf_.lora, config_, opt_, *gemm_, stream_, timer_);
    // --train-also: the trained tensors' values are the base's weights, their gradients the adapters'
    // (a tied model's lm_head offset is the embedding's: the LM head's dW lands in the one matrix's)
    if (lora_) {
        std::vector<int64_t> offsets;
        for (const std::string& name : lora_->layout().trained_base) {
            const int64_t off = layout_.offset_of(name);
            trained_grads_[off] = lora_->trained_grad(name);
            // (the FP8 base without bf16 matrices: where the weights buffer holds it, fp8_base_only)
            offsets.push_back(weights_->matrices_fp8_only() ? layout_.compact_index(off) : off);
        }
        // What derives from the trained values, after each write of them: the device copies of a bf16 base
        // held elsewhere -- streamed on one GPU (the write went to its host copy) or under ZeRO-3 (to this
        // rank's block, bound by set_communicator; collective: every rank writes after the same update) --
        // whose trained ranges changed(ranges) refreshes in the resident tensors, emptying the layer slots
        // (with norms alone the embedding and head are not copied again: ~2.2 GB a step at 7B untied); and an
        // FP8 LM head that --train-also=embeddings trains (quantised again, as the full model's update does).
        const bool block = weights_->flat_is_block();
        const bool streamed_copies = (weights_on_host(opt_) || block) && !lora_->layout().trained_base.empty();
        const bool fp8_head = opt_.fp8_lm_head && (opt_.lora.train_also & kTrainEmbeddings);
        std::vector<std::pair<int64_t, int64_t>> trained_ranges;
        for (const std::string& name : lora_->layout().trained_base) {
            const int64_t off = layout_.offset_of(name);
            trained_ranges.emplace_back(off, off + layout_.spec_of(name).numel());
        }
        std::function<void()> after_write;
        if (streamed_copies || fp8_head)
            after_write = [this, streamed_copies, fp8_head, trained_ranges] {
                if (streamed_copies) weights_->changed(trained_ranges);
                if (fp8_head) weights_->quantize_lm_head();
            };
        lora_->bind_base(buf_.weights, std::move(offsets), std::move(after_write));
        if (block) lora_->set_base_block({false, 0, 0, {}});  // (nothing written or read before set_communicator)
    }

    // zero everything with state (padding stays zero forever); with --gpus > 1 the weights are padded
    // to the ranks' equal blocks and the master (when separate) and moments are one block
    const ParamShard blocks = param_shard(layout_.total, std::max(1, opt_.gpus), 0);
    const int64_t padded = weights_->flat_is_block() ? blocks.size : blocks.padded_total();  // ZeRO-3: one block
    const int64_t master_n = buf_.master == buf_.weights ? padded : opt_.gpus > 1 ? optimizer_->elements() : layout_.total;
    if (buf_.master) zero(buf_.master, master_n * sizeof(float));
    // (the FP8 base without bf16 matrices: the norms, biases, embedding and head only)
    const int64_t weights_n = weights_->matrices_fp8_only() ? layout_.compact_total() : padded;
    if (buf_.weights != buf_.master) zero(buf_.weights, weights_n * dtype_size(opt_.model_dtype));
    zero(optimizer_->m(), optimizer_->elements() * dtype_size(opt_.opt_m_dtype));
    zero(optimizer_->v(), optimizer_->elements() * dtype_size(opt_.opt_v_dtype));
    CUDA_CHECK(cudaMemsetAsync(buf_.loss_acc, 0, 4 * sizeof(float), stream_));

    // RoPE tables, computed on the host exactly as the CPU reference (and HF) does
    const int T = opt_.seq_len, half = config_.head_dim / 2;
    std::vector<float> cs(static_cast<std::size_t>(2) * T * half);
    cpu::rope_tables(cs.data(), cs.data() + static_cast<std::size_t>(T) * half, T, config_);
    CUDA_CHECK(cudaMemcpyAsync(buf_.cos_sin, cs.data(), cs.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));

    // weight-decay segments: one per tensor, sorted by offset, with the FP8 abs-max slot of the
    // matrix a tensor belongs to (q|k|v and gate|up are one FP8 tensor each)
    // (LoRA: the frozen base has no optimizer, so no segments)
    std::vector<cuda::ParamSegment> segs;
    int64_t matrix_numel[4];
    for (int m = 0; m < 4; ++m) {
        const MatrixShape g = layer_matrix(layout_, config_, 0, static_cast<Matrix>(m));
        matrix_numel[m] = g.rows * g.cols;
    }
    for (std::size_t i = 0; i < (frozen_base() ? 0 : layout_.specs.size()); ++i) {
        const int64_t off = layout_.offsets[i];
        int slot = -1;
        if (const int l = layout_.layer_of(off); fp8_ && l >= 0)
            for (int m = 0; m < 4; ++m) {
                const int64_t begin = matrix(l, static_cast<Matrix>(m)).offset;
                if (off >= begin && off < begin + matrix_numel[m]) slot = 4 * l + m;
            }
        segs.push_back({off, layout_.specs[i].numel(), layout_.specs[i].decay() ? 1 : 0, slot});
    }
    std::sort(segs.begin(), segs.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
    optimizer_->upload_segments(segs, stream_);
    grads_->clear();
    weights_->changed();
    sync();
}

CudaModel::~CudaModel() {
    if (stream_) cudaStreamSynchronize(stream_);
    lora_.reset();
    destroy_roles();
    // (a model not trained through RankSession, e.g. a test or the Python package, still gets its table)
    if (timer_.enabled() && timer_.steps() > 0 && !breakdown_taken_)
        std::fprintf(stderr, "%s", timer_.report().c_str());
    gemm_.reset();
    for (Arena& a : arenas_) {
        if (!a.base) continue;
        if (a.pinned_host) {
            cuda::PinnedBlock block{a.base, a.allocated, a.registered};
            cuda::pinned_free(block);
        } else {
            cudaFree(a.base);
        }
    }
    for (CapturedPass& g : graphs_) {
        if (g.exec) cudaGraphExecDestroy(g.exec);
        if (g.graph) cudaGraphDestroy(g.graph);
    }
}

std::string CudaModel::performance_notes() const {
    // Once: when every GEMM shape seen so far has been decided (the LM head, one call per micro-batch,
    // takes ~25 steps), or after 50 steps with what is known by then.
    if (!opt_.gemm_autotune || tuning_reported_) return {};
    const GemmTuningStats t = gemm_->tuning_stats();
    if (t.shapes_exploring > 0 && ++tuning_note_calls_ < 50) return {};
    tuning_reported_ = true;
    char line[320];
    std::snprintf(line, sizeof line,
                  "[System] GEMM autotune: %d shapes decided in place (%lld timed calls), %d taken from this process's "
                  "earlier choices, %d still undecided; one call of each decided shape: %.3f ms with cuBLASLt's first "
                  "choice, %.3f ms with the one kept",
                  t.shapes_tuned, static_cast<long long>(t.calls_timed), t.shapes_from_cache, t.shapes_exploring,
                  t.heuristic_ms, t.chosen_ms);
    return line;
}

std::string CudaModel::take_time_breakdown() {
    if (!timer_.enabled() || timer_.steps() == 0) return {};
    breakdown_taken_ = true;
    return timer_.report();
}

void CudaModel::sync() const {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    weights_->sync();
    grads_->sync();
}

// --param-grad-dtype=bf16 rounds the host gradients with random bits independent of the optimizer's
// (same seed, salted)
constexpr uint64_t kGradRoundingSalt = 0x5bd1e995u;

void CudaModel::create_roles() {
    weights_ = std::make_unique<Weights>(buf_, layout_, config_, opt_, stream_, timer_);
    grads_ = std::make_unique<Gradients>(buf_, layout_, config_, opt_, static_cast<uint32_t>(sr_seed_ ^ kGradRoundingSalt),
                                         stream_, timer_);
    residuals_ = std::make_unique<ResidualOffload>(
        opt_.offload_residual ? buf_.res_host : nullptr, buf_.res_slots,
        static_cast<std::size_t>(opt_.batch_size) * opt_.seq_len * config_.hidden_size * dtype_size(opt_.model_dtype),
        stream_, timer_);
    optimizer_ = std::make_unique<OptimizerState>(buf_.opt, opt_);
}

void CudaModel::destroy_roles() {
    optimizer_.reset();  // each role waits for its own streams
    residuals_.reset();
    grads_.reset();
    weights_.reset();
}

// Zeroes a buffer that may be device memory or offloaded (pinned host) memory.
void CudaModel::zero(void* p, std::size_t bytes) {
    if (bytes == 0) return;  // (LoRA: the frozen base's empty moments)
    cudaPointerAttributes attr{};
    CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
    if (attr.type == cudaMemoryTypeHost) {
        cuda::fill_zero(p, bytes, stream_);  // stream-ordered, like the memset below
    } else {
        CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    }
}

// A plain cudaMemcpy runs on the legacy default stream, which does not order with stream_ (a
// non-blocking stream), and from pageable memory it may return before its DMA lands: a kernel on
// stream_ reading the destination right after could see the old bytes. That race corrupted resumed
// Adam moments (NaN on the second step after --continue).
void CudaModel::upload(void* dst, const void* src, std::size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// Sets parameter values [off, off + n) from fp32 host data: into the fp32 master, or, with
// --master-dtype=bf16, into the bf16 weights (rounded to nearest, as an HF bf16 checkpoint would be).
// Data parallel with the master a rank's block: the weights take every value (rounded to nearest, as
// refresh_weights rounds the master) and the master its block's.
void CudaModel::upload_parameters(int64_t off, const float* host, int64_t n) {
    // (the buffers are a rank's blocks: which block is known once the rank is)
    QT_CHECK(opt_.gpus <= 1 || comm_, "GPU model: set_communicator must come before the parameters are set (",
             flag(&ModelOptions::gpus), "=", opt_.gpus, ")");
    if (master_is_block()) {
        const int64_t lo = std::max(off, shard_.begin), hi = std::min(off + n, shard_.end);
        if (weights_->flat_is_block()) {  // ZeRO-3: the weights of the block only (changed() sends the resident ones)
            if (lo < hi)
                store_values(static_cast<char*>(buf_.weights) + (lo - shard_.begin) * dtype_size(opt_.model_dtype),
                             opt_.model_dtype, host + (lo - off), hi - lo);
        } else {
            store_values(static_cast<char*>(buf_.weights) + off * dtype_size(opt_.model_dtype), opt_.model_dtype, host,
                         n);
        }
        if (lo < hi) store_values(buf_.master + (lo - shard_.begin), DType::F32, host + (lo - off), hi - lo);
        return;
    }
    // ZeRO-3 with --master-dtype=bf16 (the weights block is the master), or LoRA's bf16 base's block
    if (weights_->flat_is_block()) {
        const int64_t lo = std::max(off, shard_.begin), hi = std::min(off + n, shard_.end);
        if (lo < hi) store_values(static_cast<uint16_t*>(buf_.weights) + (lo - shard_.begin), DType::BF16,
                                  host + (lo - off), hi - lo);
        return;
    }
    if (buf_.master) {
        store_values(buf_.master + off, DType::F32, host, n);
        return;
    }
    // --master-dtype=bf16 (bf16 weights), or a frozen LoRA base: the model-dtype weights are all there is
    // (the FP8 base without bf16 matrices: at the tensor's place among the others, set_base_tensor)
    const DType t = opt_.model_dtype;
    QT_CHECK(!fp8_only_matrix(off), "GPU model: internal error (a matrix of the FP8 base stored in bf16)");
    const int64_t at = weights_->matrices_fp8_only() ? layout_.compact_index(off) : off;
    store_values(static_cast<char*>(buf_.weights) + at * dtype_size(t), t, host, n);
}

// Offloaded (pinned host) destinations are written by all cores directly: a cudaMemcpy between two
// host buffers runs on one thread, and a temporary bf16 copy would be zero-filled and page-faulted on
// one thread too (for 14B, ~30 GB each way at initialisation and load).
void CudaModel::store_values(void* dst, DType t, const float* host, int64_t n) {
    QT_CHECK(t == DType::F32 || t == DType::BF16, "GPU model: parameters are stored as fp32 or bf16");
    cudaPointerAttributes attr{};
    CUDA_CHECK(cudaPointerGetAttributes(&attr, dst));
    if (attr.type == cudaMemoryTypeHost) {
        CUDA_CHECK(cudaStreamSynchronize(stream_));  // nothing queued may still read the old values
        if (t == DType::F32) {
            float* out = static_cast<float*>(dst);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
            for (int64_t i = 0; i < n; ++i) out[i] = host[i];
        } else {
            uint16_t* out = static_cast<uint16_t*>(dst);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
            for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(host[i]);
        }
        return;
    }
    if (t == DType::F32) {
        upload(dst, host, n * sizeof(float));
        return;
    }
    std::unique_ptr<uint16_t[]> rounded(new uint16_t[n]);  // not value-initialised: every element is set
#pragma omp parallel for schedule(static) if (n > (1 << 16))  // 14.7G values for 14B: 26 s on one core
    for (int64_t i = 0; i < n; ++i) rounded[i] = float_to_bf16(host[i]);
    upload(dst, rounded.get(), n * sizeof(uint16_t));
}

void CudaModel::refresh_weights() {
    // (a block master: upload_parameters has written the weights themselves)
    if (buf_.master && buf_.weights != buf_.master && !master_is_block())
        cuda::convert_from_f32(buf_.weights, opt_.model_dtype, buf_.master, layout_.total, stream_);
    weights_->changed();
    weights_->quantize();
}

// weights in and out
// ---------------------------------------------------------------------------------------------

void CudaModel::set_base_tensor(std::size_t i, const float* host, void* staging) {
    const int64_t off = layout_.offsets[i], n = layout_.specs[i].numel();
    if (!fp8_only_matrix(off)) return upload_parameters(off, host, n);
    const int l = layout_.layer_of(off);
    for (int mi = 0; mi < 4; ++mi) {
        const Matrix m = static_cast<Matrix>(mi);
        const MatrixShape g = matrix(l, m);
        const int64_t end = g.offset + g.rows * g.cols;
        if (off < g.offset || off >= end) continue;
        // rounded to the model dtype as upload_parameters rounds, so the abs-max and codes are those
        // of quantising the bf16 base (store_values waits for its copy: the previous quantisation,
        // queued on the same stream, has read the staging buffer by then)
        store_values(static_cast<char*>(staging) + (off - g.offset) * dtype_size(opt_.model_dtype), opt_.model_dtype,
                     host, n);
        if (off + n == end) weights_->quantize_matrix(l, m, staging);
        return;
    }
    QT_CHECK(false, "GPU model: internal error (", layout_.specs[i].name, " is in no matrix of layer ", l, ")");
}

void CudaModel::make_base_staging(StagingBuffer& s) const {
    if (!weights_->matrices_fp8_only()) return;
    int64_t largest = 0;
    for (int m = 0; m < 4; ++m) {
        const MatrixShape g = matrix(0, static_cast<Matrix>(m));
        largest = std::max(largest, g.rows * g.cols);
    }
    const std::size_t bytes = largest * dtype_size(opt_.model_dtype);
    for (const Arena& a : arenas_)
        if (a.category == "Activations" && a.base && !a.pinned_host && a.allocated >= bytes) {
            CUDA_CHECK(cudaStreamSynchronize(stream_));  // (nothing queued still reads them)
            s.p = a.base;
            return;
        }
    CUDA_CHECK(cudaMalloc(&s.p, bytes));
    s.owned = true;
}

std::vector<float> CudaModel::base_values_from_source(const ParamSpec& s) const {
    QT_CHECK(base_loaded_, "GPU model: '", s.name, "' is a matrix of the FP8 base, which keeps only its e4m3 copy on "
             "the GPU and reads its bf16 values from where it was loaded; nothing has been loaded yet");
    std::vector<float> v(s.numel());
    if (!base_dir_.empty()) SafeTensorsReader::open_dir(base_dir_).read_finite_f32(s.name, s.shape, v.data());
    else init_parameter(s, config_, base_seed_, v.data());
    if (opt_.model_dtype == DType::BF16) {  // as the bf16 base would hold it (store_values rounds to nearest)
#pragma omp parallel for schedule(static) if (s.numel() > (1 << 16))
        for (int64_t i = 0; i < s.numel(); ++i) v[i] = bf16_to_float(float_to_bf16(v[i]));
    }
    return v;
}

void CudaModel::init_random(uint64_t seed) {
    // One buffer for the largest tensor, not value-initialised: init_parameter sets every element, and
    // its first touch then happens on all cores.
    int64_t largest = 0;
    for (const ParamSpec& s : layout_.specs) largest = std::max(largest, s.numel());
    std::unique_ptr<float[]> host(new float[largest]);
    const int64_t total = config_.num_parameters();
    int64_t done = 0;
    StagingBuffer staging;  // (the FP8 base without bf16 matrices)
    make_base_staging(staging);
    for (std::size_t i = 0; i < layout_.specs.size(); ++i) {
        const ParamSpec& s = layout_.specs[i];
        init_parameter(s, config_, seed, host.get());
        set_base_tensor(i, host.get(), staging.p);
        report_progress("initialising", done += s.numel(), total);
    }
    base_dir_.clear(), base_seed_ = seed, base_loaded_ = true;
    zero(optimizer_->m(), optimizer_->elements() * dtype_size(opt_.opt_m_dtype));
    zero(optimizer_->v(), optimizer_->elements() * dtype_size(opt_.opt_v_dtype));
    refresh_weights();
    start_adapters();
    sync();
}

void CudaModel::start_adapters() {
    if (!lora_) return;
    lora_->host().init(opt_.lora.seed);
    lora_->read_base_into_host();  // (--train-also's tensors start as the base; --lora-from may replace them)
    if (!opt_.lora.from.empty()) lora_->host().load_adapter(opt_.lora.from, flag(&LoraOptions::from));
    lora_->upload_from_host();
}

void CudaModel::load_hf(const std::string& model_dir) {
    SafeTensorsReader reader = SafeTensorsReader::open_dir(model_dir);
    std::vector<float> host;
    const int64_t total = config_.num_parameters();
    int64_t done = 0;
    StagingBuffer staging;  // (the FP8 base without bf16 matrices)
    make_base_staging(staging);
    for (std::size_t i = 0; i < layout_.specs.size(); ++i) {
        const ParamSpec& s = layout_.specs[i];
        host.resize(s.numel());
        reader.read_finite_f32(s.name, s.shape, host.data());
        set_base_tensor(i, host.data(), staging.p);
        report_progress("loading", done += s.numel(), total);
    }
    base_dir_ = model_dir, base_loaded_ = true;
    refresh_weights();
    start_adapters();
    sync();
}

std::vector<float> CudaModel::fetch_values(const void* base, DType t, int64_t off, int64_t n) const {
    std::vector<float> out(n);
    if (t == DType::F32) {
        CUDA_CHECK(cudaMemcpy(out.data(), static_cast<const float*>(base) + off, n * sizeof(float), cudaMemcpyDefault));
        return out;
    }
    std::vector<uint16_t> raw(n);
    CUDA_CHECK(cudaMemcpy(raw.data(), static_cast<const uint16_t*>(base) + off, n * sizeof(uint16_t), cudaMemcpyDefault));
#pragma omp parallel for schedule(static) if (n > (1 << 16))  // the export of a large model: all cores
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(raw[i]);
    return out;
}

std::vector<float> CudaModel::download_weights(int64_t off, int64_t n) const {
    // (the FP8 base without bf16 matrices: a non-matrix tensor's place among the others, whole on every rank)
    if (!weights_->flat_is_block())
        return fetch_values(buf_.weights, opt_.model_dtype,
                            weights_->matrices_fp8_only() ? layout_.compact_index(off) : off, n);
    // ZeRO-3: gathered from the owners into a device buffer (collective)
    void* tmp = nullptr;
    CUDA_CHECK(cudaMalloc(&tmp, std::max<int64_t>(1, n) * dtype_size(opt_.model_dtype)));
    try {
        weights_->gather_range(off, off + n, tmp, stream_);
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        std::vector<float> out = fetch_values(tmp, opt_.model_dtype, 0, n);
        CUDA_CHECK(cudaFree(tmp));
        return out;
    } catch (...) {
        cudaFree(tmp);
        throw;
    }
}

std::vector<float> CudaModel::download(const std::string& name, Which which) const {
    if (lora_ && lora_->host().has(name)) {
        using W = LoraAdapters::Which;
        return lora_->download(name, which == Which::Grad    ? W::Grad
                                     : which == Which::AdamM ? W::AdamM
                                     : which == Which::AdamV ? W::AdamV
                                                             : W::Master);
    }
    // a --train-also tensor by its HF name: its fp32 state is the adapters' (Weights: the base's copy)
    if (lora_ && which != Which::Weights && lora_->host().has(kPeftPrefix + name))
        return download(kPeftPrefix + name, which);
    QT_CHECK(!frozen_base() || which == Which::Master || which == Which::Weights, "GPU model: '", name,
             "' is frozen under LoRA (", flag(&LoraOptions::rank), "): it has no gradient or Adam moments");
    const ParamSpec& s = layout_.spec_of(name);
    const int64_t off = layout_.offset_of(name), n = s.numel();
    if (fp8_only_matrix(off)) return base_values_from_source(s);  // (Master or Weights: the bf16 base's values)
    sync();
    QT_CHECK(!(which == Which::Master && master_is_block()) &&
                 !((which == Which::AdamM || which == Which::AdamV) && moments_are_block()) &&
                 !(which == Which::Grad && grads_->reduced_per_layer()),
             "GPU model: with ", flag(&ModelOptions::gpus), "=", opt_.gpus,
             " this rank holds only its block of the master weights and Adam's moments (and with ZeRO-2 of the "
             "gradient), not the whole of ",
             name);
    switch (which) {
        case Which::Master:
            if (buf_.master) return fetch_values(buf_.master, DType::F32, off, n);
            return download_weights(off, n);  // --master-dtype=bf16: the weights are the master
        case Which::Weights: return download_weights(off, n);
        case Which::Grad:
            if (grads_->on_device_until_update(off)) {  // the resident non-layer gradients
                std::vector<float> out(n);
                CUDA_CHECK(cudaMemcpy(out.data(), grads_->at(off), n * sizeof(float), cudaMemcpyDefault));
                return out;
            }
            // the host copy of the layers still holds the last step's: logically zero (the embedding
            // of untied models is summed into the host copy in place, and read there)
            if (grads_->streamed() && grads_->host_fresh() &&
                !(grads_->embedding_on_host() && off < layout_.layer_begin(0)))
                return std::vector<float>(n, 0.0f);
            return fetch_values(grads_->flat(), opt_.param_grad_dtype, off, n);
        case Which::AdamM: return fetch_values(optimizer_->m(), opt_.opt_m_dtype, off, n);
        case Which::AdamV: return fetch_values(optimizer_->v(), opt_.opt_v_dtype, off, n);
    }
    return {};
}

std::vector<uint8_t> CudaModel::download_fp8_matrix(int l, Matrix m, bool transposed) const {
    const MatrixShape g = matrix(l, m);
    std::vector<uint8_t> out(g.rows * g.cols);
    if (weights_->streamed() && weights_->matrices_fp8_only() && !transposed) {
        // the streamed FP8 base's host codes, or under ZeRO-3 gathered from the ranks' blocks (collective)
        void* tmp = nullptr;
        CUDA_CHECK(cudaMalloc(&tmp, out.size()));
        weights_->gather_codes(g.offset, g.offset + static_cast<int64_t>(out.size()), tmp, stream_);
        const cudaError_t e = cudaStreamSynchronize(stream_);
        if (e == cudaSuccess) CUDA_CHECK(cudaMemcpy(out.data(), tmp, out.size(), cudaMemcpyDeviceToHost));
        cudaFree(tmp);
        CUDA_CHECK(e);
        return out;
    }
    QT_CHECK(fp8_ && !weights_->streamed() && (!transposed || fp8_grads_),
             "GPU model: no resident FP8 copy of that kind (", flag(&ModelOptions::matmul_dtype), "=e4m3 without ",
             flag(&ModelOptions::shard_weights), "; transposed: with FP8 gradients)");
    // (transposed, the FP8 base without kept transposes makes the copy the backward would read)
    const void* src = transposed ? weights_->transposed(l, m) : weights_->q(g.offset);
    sync();
    CUDA_CHECK(cudaMemcpy(out.data(), src, out.size(), cudaMemcpyDeviceToHost));
    return out;
}

std::pair<float, float> CudaModel::fp8_matrix_scale(int l, Matrix m) const {
    QT_CHECK(fp8_, "GPU model: no FP8 scales without ", flag(&ModelOptions::matmul_dtype), "=e4m3");
    float amax = 0.0f, inv = 0.0f;
    sync();
    CUDA_CHECK(cudaMemcpy(&amax, weights_->amax(l, m), sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&inv, weights_->inv_scale(l, m), sizeof(float), cudaMemcpyDeviceToHost));
    return {amax, inv};
}

void CudaModel::upload_master(const std::string& name, const float* data) {
    if (lora_ && lora_->host().has(name)) {  // an adapter: through the host mirror (moments kept)
        lora_->download_to_host();
        const ParamSpec& a = lora_->host().spec(name);
        std::copy(data, data + a.numel(), lora_->host().param(name));
        lora_->upload_from_host();
        return;
    }
    const ParamSpec& s = layout_.spec_of(name);
    const int64_t off = layout_.offset_of(name);
    QT_CHECK(!fp8_only_matrix(off), "GPU model: '", name, "' is a matrix of the FP8 base (", flag(&LoraOptions::rank),
             " with ", flag(&ModelOptions::matmul_dtype), "=e4m3 and ", flag(&ModelOptions::gradient_dtype), "=",
             dtype_name(opt_.gradient_dtype), "), which the GPU keeps only as its e4m3 copy, quantised once by the load "
             "(of the base's files or its seed): it cannot be set afterwards (with ", flag(&ModelOptions::gradient_dtype),
             "=bf16 the bf16 base is kept and can)");
    upload_parameters(off, data, s.numel());
    refresh_weights();
    if (lora_ && trained_grads_.count(off)) {  // a --train-also tensor: its master follows (moments kept)
        lora_->download_to_host();
        lora_->read_base_into_host(name);
        lora_->upload_from_host();
    }
    sync();
}

void CudaModel::save_hf(const std::string& dir) const {
    if (lora_) {  // LoRA: the PEFT adapter (the CPU model's writer), or with --merge-lora the merged model
        lora_->download_to_host();  // (collective with several ranks: saves_collectively)
        // (the merge of a base sharded over the ranks, ZeRO-3 of the bf16 base, gathers it: every rank)
        if (comm_ && comm_->rank() != 0 && !(opt_.lora.merge && weights_->flat_is_block())) return;
        if (!opt_.lora.merge) return lora_->host().save_adapter(dir);
        return write_weights(dir, Which::Weights, true);
    }
    // a block master (--gpus > 1): the whole weights, which are the master rounded as stored
    write_weights(dir, master_is_block() || weights_->sharded() ? Which::Weights : Which::Master, false);
}

void CudaModel::write_weights(const std::string& dir, Which which, bool merge_lora) const {
    // HF checkpoints carry the training dtype (bf16 or fp32)
    const int64_t total = config_.num_parameters();
    int64_t done = 0;
    auto values_of = [&](const ParamSpec& s) {
        auto values = download(s.name, which);
        if (merge_lora) lora_->host().merge_tensor(s, values.data());  // W + s B A, as PEFT's merge_and_unload
        report_progress("exporting", done += s.numel(), total);
        return values;
    };
    if (!weights_->flat_is_block()) return write_hf_model(dir, config_, opt_.model_dtype, values_of);
    // ZeRO-3 (collective, imodel.h): every rank gathers the tensors in the order write_hf_model asks
    // for them (canonical HF order); rank 0 writes. When rank 0's write fails it still takes part in
    // the gathers of the tensors left, so the others finish, and then reports the error.
    const std::vector<ParamSpec> specs = model_parameters(config_);
    std::size_t gathered = 0;
    if (shard_.rank != 0) {
        for (const ParamSpec& s : specs) download(s.name, which);
        return;
    }
    try {
        write_hf_model(dir, config_, opt_.model_dtype, [&](const ParamSpec& s) {
            QT_CHECK(gathered < specs.size() && specs[gathered].name == s.name,
                     "GPU model: internal error (the HF export asked for ", s.name, " out of order)");
            ++gathered;
            return values_of(s);
        });
    } catch (...) {
        for (; gathered < specs.size(); ++gathered) download(specs[gathered].name, which);
        throw;
    }
    QT_CHECK(gathered == specs.size(), "GPU model: internal error (the HF export gathered ", gathered, " of ",
             specs.size(), " tensors)");
}

void CudaModel::save_checkpoint(const std::string& dir) const {
    if (lora_) {  // the adapters and their moments only, in the CPU model's files: the base is --model's
        // (several ranks: every rank's block gathered, collective; rank 0 writes the whole state once)
        lora_->download_to_host();
        if (comm_ && comm_->rank() != 0) return;
        return lora_->host().save_checkpoint(dir);
    }
    if (moments_are_block()) return save_block_checkpoint(dir);
    SafeTensorsWriter model_w, opt_w;  // one tensor at a time in host memory
    const int64_t total = 3 * config_.num_parameters();  // master, m, v
    auto done = std::make_shared<int64_t>(0);
    for (const ParamSpec& s : model_parameters(config_)) {
        auto from = [this, name = s.name, n = s.numel(), total, done](Which which) {
            return [this, name, which, n, total, done] {
                auto values = download(name, which);
                report_progress("checkpointing", *done += n, total);
                return values;
            };
        };
        // the master as it is: fp32, or bf16 (exact: --master-dtype=bf16 keeps no more precision)
        model_w.add_f32_deferred(s.name, s.shape, from(Which::Master), opt_.master_dtype);
        opt_w.add_f32_deferred(s.name + ".exp_avg", s.shape, from(Which::AdamM), opt_.opt_m_dtype);
        opt_w.add_f32_deferred(s.name + ".exp_avg_sq", s.shape, from(Which::AdamV), opt_.opt_v_dtype);
    }
    model_w.write((fs::path(dir) / "model.safetensors").string());
    opt_w.write((fs::path(dir) / "optimizer.safetensors").string());
}

// Any checkpoint of this model (io/flat_state_reader.h): the named tensors of one GPU or the CPU model,
// read tensor by tensor as before, or the blocks of N ranks, each tensor's range assembled from the
// pieces it overlaps.
void CudaModel::load_checkpoint(const std::string& dir) {
    if (lora_) {  // the base was loaded from --model first (the engine's resume)
        lora_->host().load_checkpoint(dir);
        lora_->upload_from_host();
        CUDA_CHECK(cudaMemsetAsync(buf_.loss_acc, 0, 4 * sizeof(float), stream_));
        sync();
        return;
    }
    if (moments_are_block()) return load_block_checkpoint(dir);
    const FlatStateReader r(dir, flat_layout_of(layout_));
    std::vector<float> host;
    float* staging = nullptr;
    CUDA_CHECK(cudaMalloc(&staging, sizeof(float) * static_cast<std::size_t>(std::max<int64_t>(1, [&] {
                   int64_t m = 0;
                   for (const auto& s : layout_.specs) m = std::max(m, s.numel());
                   return m;
               }()))));
    int64_t done = 0;
    try {
        for (std::size_t i = 0; i < layout_.specs.size(); ++i) {
            const ParamSpec& s = layout_.specs[i];
            const int64_t off = layout_.offsets[i], n = s.numel();
            host.resize(n);
            r.read(FlatArray::Master, off, off + n, host.data());
            upload_parameters(off, host.data(), n);
            auto load_moment = [&](FlatArray array, void* base, DType t) {
                r.read(array, off, off + n, host.data());
                upload(staging, host.data(), n * sizeof(float));
                cuda::convert_from_f32(static_cast<char*>(base) + off * dtype_size(t), t, staging, n, stream_);
                sync();
            };
            load_moment(FlatArray::ExpAvg, optimizer_->m(), opt_.opt_m_dtype);
            load_moment(FlatArray::ExpAvgSq, optimizer_->v(), opt_.opt_v_dtype);
            report_progress("loading the checkpoint", done += 3 * n, 3 * config_.num_parameters());
        }
    } catch (...) {
        cudaFree(staging);
        throw;
    }
    CUDA_CHECK(cudaFree(staging));
    grads_->clear();
    CUDA_CHECK(cudaMemsetAsync(buf_.loss_acc, 0, 4 * sizeof(float), stream_));
    refresh_weights();
    sync();
}

}  // namespace qtrain
