// The flags of `train` (option_table.h says who reads this). The order is the --help order; a new
// flag needs its TrainOptions field, an entry here and a row in the README's flag table (a CLI test
// checks that every flag of --help is documented there).
#include "train/option_table.h"

#include "core/error.h"
#include "model/arch/architecture.h"
#include "model/model_config.h"

#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "core/error.h"
#include "core/files.h"

namespace qtrain {

namespace {

using T = TrainOptions;
using M = ModelOptions;
using R = ResumeRule;

const char* const kModel = "Model";
const char* const kData = "Data";
const char* const kPrecision = "Precision";
const char* const kRecompute = "Recompute";
const char* const kOffload = "Offload";
const char* const kMultiGpu = "Multi-GPU";
const char* const kPerf = "Performance and memory";
const char* const kOptim = "Optimisation";
const char* const kOutput = "Evaluation, checkpoints and output";
const char* const kLora = "LoRA";

// An entry under construction: opt(...), then what the model takes from it (.model), what the models'
// messages call it (.names; .model(&M::field, ...) says both) and what it implies (.implying).
struct Entry : OptionSpec {
    // The flag's value copied into the model's field `to`, which has the flag field's type.
    template <class V>
    Entry&& model(V M::* to) && {
        const auto* from = std::get_if<V T::*>(&member);
        if (!from) throw std::logic_error("option table: --" + name + " and its ModelOptions field differ in type");
        to_model = [from = *from, to](const OptionSpec&, const T& o, const std::string&, M& m) { m.*to = o.*from; };
        model_flag = to;
        return std::move(*this);
    }
    // `set` fills the model's field `field` (a conversion: a dtype, an enum, a size).
    template <class V>
    Entry&& model(V M::* field, ModelSetter set) && {
        to_model = std::move(set);
        model_flag = field;
        return std::move(*this);
    }
    // A dtype flag whose value is given ("fp32" by default), one of `allowed` ("fp32|bf16").
    Entry&& dtype(DType M::* to, const char* allowed) && {
        return std::move(*this).model(to, [to, allowed](const OptionSpec& spec, const T& o, const std::string&, M& m) {
            m.*to = parse_dtype(o.*std::get<std::string T::*>(spec.member), flag_name(spec), allowed);
        });
    }
    // `set` fills several fields, or fields the models name otherwise (.names).
    Entry&& model(ModelSetter set) && {
        to_model = std::move(set);
        return std::move(*this);
    }
    // What the models' messages name this flag by, where no `.model(&M::field)` says it: a LoRA field or a
    // RunFlag (model/flag_names.h).
    Entry&& names(ModelFlag key) && {
        model_flag = key;
        return std::move(*this);
    }
    Entry&& implying(std::vector<OptionImplication> flags) && {
        implies = std::move(flags);
        return std::move(*this);
    }
};

// `flag` turned on when this one's value is at least `from` (a bool flag: when given), with
// `several_ranks` only when --gpus > 1.
OptionImplication turns_on(bool T::* flag, int from = 1, bool several_ranks = false) {
    OptionImplication i;
    i.flag = flag;
    i.from = from;
    i.several_ranks = several_ranks;
    return i;
}

// One entry; `names` is the long name, then any aliases, comma-separated ("batch-size,batch").
// Functions rather than aggregate initialisers: -Wextra warns about every omitted member of those.
Entry opt(const char* group, std::string_view names, OptionMember member, R resume, std::string help,
          OptionCheck check = {}, std::string python = {}) {
    Entry spec;
    for (size_t start = 0; start <= names.size();) {
        const size_t end = std::min(names.find(',', start), names.size());
        std::string name(names.substr(start, end - start));
        if (spec.name.empty()) spec.name = std::move(name);
        else spec.aliases.push_back(std::move(name));
        start = end + 1;
    }
    spec.group = group;
    spec.member = member;
    spec.resume = resume;
    spec.help = std::move(help);
    spec.check = std::move(check);
    spec.python = std::move(python);
    return spec;
}

OptionCheck choices(std::vector<std::string> values) {
    OptionCheck check;
    check.choices = std::move(values);
    return check;
}

OptionCheck range(int min, int max) {
    OptionCheck check;
    check.range = std::pair{min, max};
    return check;
}

OptionCheck non_negative() {
    OptionCheck check;
    check.non_negative = true;
    return check;
}

// Resume rules, as resume_check.h explains them: MayChange are where things go, how often they
// happen, how long the run is, and how memory and speed are traded (each bit-identical to the plain
// run or different only in rounding); MustMatch change the math or the data (--gpus and
// --grad-accumulation are compared together there: they may trade against each other).
std::vector<OptionSpec> make_table() {
    return {
        // Model
        opt(kModel, "model", &T::model, R::MayChange,
            cat("HF model directory (", supported_architectures_text(), "), org/name in the local HF cache, or a "
                "preset with --from-scratch: ", preset_list_text())),
        opt(kModel, "from-scratch", &T::from_scratch, R::MayChange,
            "Random initialisation instead of loading weights (shape from --model)"),
        opt(kModel, "tokenizer", &T::tokenizer, R::MayChange,
            "The data's tokenizer (what tokenize --tokenizer took: tokenizer.json, qwen.tiktoken, a model "
            "directory or a model in the local HF cache); its HF tokenizer files go to --out-dir with the "
            "model (default: those in --model's directory, if any)"),
        opt(kModel, "device", &T::device, R::MayChange,
            "Where to train: auto (GPU if present), cpu (reference model) or cuda", choices({"auto", "cpu", "cuda"}))
            .names(RunFlag::Device),

        // Data
        opt(kData, "train-file", &T::train_file, R::MustMatch,
            "Training token file(s), BIN.TOK format; a glob (quote it)"),
        opt(kData, "eval-file", &T::eval_file, R::MayChange, "Evaluation token file(s); a glob"),
        opt(kData, "batch-size,batch", &T::batch_size, R::MustMatch,
            "Micro-batch size (sequences per GPU per micro-step)").model(&M::batch_size),
        opt(kData, "seq-len", &T::seq_len, R::MustMatch, "Sequence length in tokens").model(&M::seq_len),
        // auto is resolved where the train files are opened (packing_options.h); the model is told
        // then, so here only "on" turns it on
        opt(kData, "document-masking", &T::document_masking, R::MustMatch,
            "Pack several documents into each --seq-len row, attention never crossing a document and positions "
            "restarting at each: documents from the token files' document starts, or ending after each EOS "
            "token; longer ones are split. auto: on when every --train-file records document starts (chat data)",
            choices({"auto", "on", "off"}))
            .model(&M::document_masking, [](const OptionSpec&, const T& o, const std::string&, M& m) {
                m.document_masking = o.document_masking == "on";
            }),
        opt(kData, "loss-normalization", &T::loss_normalization, R::MustMatch,
            "tokens: the loss is the mean over the trained tokens of the whole optimizer step (all micro-batches "
            "and ranks), so every trained token weighs alike; micro-batch: the mean of each micro-batch's mean. "
            "auto: tokens with document masking, micro-batch otherwise",
            choices({"auto", "tokens", "micro-batch"})),
        opt(kData, "packing", &T::packing, R::MustMatch,
            "With document masking: greedy fills each --seq-len row with as many whole documents as fit (only the "
            "row's tail is padding); one-per-row gives every document a row of its own, padded (llm.q's way; "
            "for comparing speed, it wastes the padding's compute)",
            choices({"greedy", "one-per-row"})),

        // Precision ("" dtypes are the device's defaults, so they are compared resolved)
        opt(kPrecision, "model-dtype", &T::model_dtype, R::Resolved,
            "Weights and activations: fp32|bf16 (default: fp32 on cpu, bf16 on cuda)")
            .model(&M::model_dtype, [](const OptionSpec& spec, const T& o, const std::string& device, M& m) {
                const std::string dtype = o.model_dtype.empty() ? (device == "cpu" ? "fp32" : "bf16") : o.model_dtype;
                m.model_dtype = parse_dtype(dtype, flag_name(spec), "fp32|bf16");
            }),
        opt(kPrecision, "matmul-dtype", &T::matmul_dtype, R::Resolved,
            "Matmul inputs: fp32|bf16|e4m3 (default: the model dtype; with --lora-rank, e4m3 is the FP8 frozen base)")
            .model(&M::matmul_dtype, [](const OptionSpec& spec, const T& o, const std::string&, M& m) {
                m.matmul_dtype = o.matmul_dtype.empty()
                                     ? m.model_dtype
                                     : parse_dtype(o.matmul_dtype, flag_name(spec), "fp32|bf16|e4m3");
            }),
        opt(kPrecision, "gradient-dtype", &T::gradient_dtype, R::Resolved,
            "Activation gradients into matmuls: fp32|bf16|e4m3|e5m2 (default: the matmul dtype; bf16 when matmuls "
            "are fp8)")
            .model(&M::gradient_dtype, [](const OptionSpec& spec, const T& o, const std::string&, M& m) {
                // "" = the matmul dtype, bf16 when matmuls are fp8
                m.gradient_dtype = !o.gradient_dtype.empty()
                                       ? parse_dtype(o.gradient_dtype, flag_name(spec), "fp32|bf16|e4m3|e5m2")
                                   : m.matmul_dtype == DType::E4M3 ? DType::BF16
                                                                   : m.matmul_dtype;
            }),
        // FP8 LM head (issue 32): changes the numerics, so off by default and must match on resume; it needs
        // --matmul-dtype=e4m3, which the backends check (CudaModel/CpuModel::check_options) naming both flags
        opt(kPrecision, "lm-head-dtype", &T::lm_head_dtype, R::MustMatch,
            "LM head GEMMs: bf16 (the model dtype, as before) or e4m3 (needs --matmul-dtype=e4m3): the logits GEMM in "
            "FP8, and with --gradient-dtype=e4m3|e5m2 its dx and dW GEMMs too (always with exact accumulation: "
            "--fp8-fast-accum=all lost 3% of eval loss there). Changes the numerics (the logits carry FP8 rounding), "
            "so off by default; its 300-step loss held within 1% of bf16 on two runs (docs/benchmarks.md)",
            choices({"bf16", "e4m3"}))
            .model(&M::fp8_lm_head, [](const OptionSpec&, const T& o, const std::string&, M& m) {
                m.fp8_lm_head = o.lm_head_dtype == "e4m3";
            }),
        opt(kPrecision, "opt-m-dtype", &T::opt_m_dtype, R::MustMatch,
            "Adam first moment: fp32|bf16 (bf16 uses stochastic rounding)")
            .dtype(&M::opt_m_dtype, "fp32|bf16"),
        opt(kPrecision, "opt-v-dtype", &T::opt_v_dtype, R::MustMatch,
            "Adam second moment: fp32|bf16 (bf16 uses stochastic rounding)")
            .dtype(&M::opt_v_dtype, "fp32|bf16"),
        opt(kPrecision, "master-dtype", &T::master_dtype, R::MustMatch,
            "Master weights: fp32|bf16. bf16 (with --model-dtype=bf16, GPU): no fp32 copy, AdamW updates the bf16 "
            "weights with stochastic rounding; saves 4 bytes per parameter")
            .dtype(&M::master_dtype, "fp32|bf16"),
        opt(kPrecision, "param-grad-dtype", &T::param_grad_dtype, R::MustMatch,
            "Accumulated parameter gradients: fp32|bf16. bf16 (GPU): the copy kept for the step is bf16, each "
            "micro-batch's layer gradient summed in fp32 (a device slot) and added into it with stochastic rounding; "
            "saves 2 bytes per parameter, in pinned memory with --offload-gradients, else on the device (less the "
            "two fp32 layer slots and the fp32 non-layer gradients). llm.q keeps bf16 gradients too")
            .dtype(&M::param_grad_dtype, "fp32|bf16"),

        // Recompute
        opt(kRecompute, "recompute-swiglu", &T::recompute_swiglu, R::MayChange,
            "Recompute the SwiGLU activation in the backward pass").model(&M::recompute_swiglu),
        opt(kRecompute, "recompute-norm", &T::recompute_norm, R::MayChange,
            "Recompute RMSNorm outputs in the backward pass").model(&M::recompute_norm),
        opt(kRecompute, "recompute-qkv", &T::recompute_qkv, R::MayChange,
            "Recompute the QKV projection in the backward pass").model(&M::recompute_qkv),
        opt(kRecompute, "recompute-ffn", &T::recompute_ffn, R::MayChange,
            "Recompute the whole feed-forward block (implies --recompute-swiglu)")
            .model(&M::recompute_ffn).implying({turns_on(&T::recompute_swiglu)}),
        opt(kRecompute, "recompute-att", &T::recompute_att, R::MayChange,
            "Recompute the whole attention block (implies --recompute-qkv)")
            .model(&M::recompute_att).implying({turns_on(&T::recompute_qkv)}),
        opt(kRecompute, "recompute-block", &T::recompute_block, R::MayChange,
            "Recompute the whole transformer block (implies all of the above)")
            .model(&M::recompute_block)
            .implying({turns_on(&T::recompute_ffn), turns_on(&T::recompute_att), turns_on(&T::recompute_norm)}),

        // Offload
        opt(kOffload, "offload-residual", &T::offload_residual, R::MayChange,
            "Keep the residual stream of each layer in pinned host memory").model(&M::offload_residual),
        opt(kOffload, "offload-master", &T::offload_master, R::MayChange, "Keep master weights in pinned host memory")
            .model(&M::offload_master),
        opt(kOffload, "offload-opt-m", &T::offload_opt_m, R::MayChange,
            "Keep Adam's first moment in pinned host memory").model(&M::offload_opt_m),
        opt(kOffload, "offload-opt-v", &T::offload_opt_v, R::MayChange,
            "Keep Adam's second moment in pinned host memory").model(&M::offload_opt_v),
        opt(kOffload, "offload-quants", &T::offload_quants, R::MayChange,
            "Keep the FP8 copies of streamed layers (--persistent-quants) in pinned host memory instead of on the GPU "
            "(implies --persistent-quants; needs --shard-weights)").model(&M::offload_quants),
        opt(kOffload, "offload-gradients", &T::offload_gradients, R::MayChange,
            "Keep (sharded) gradients in pinned host memory (untied models: the embedding's gradient is summed there "
            "directly, so no [vocab, hidden] fp32 table stays on the GPU)").model(&M::offload_gradients),
        opt(kOffload, "persistent-quants", &T::persistent_quants, R::MayChange,
            "With --shard-weights and FP8 (e4m3 matmuls, e4m3|e5m2 gradients): quantise each streamed layer once per "
            "optimizer step and keep its FP8 copy, so later passes move 1 byte per weight instead of 2 (resident FP8 "
            "weights are always kept)").model(&M::persistent_quants),
        opt(kOffload, "offload-double-buffer", &T::offload_double_buffer, R::MayChange,
            "The optimizer stages offloaded master/moments/gradients/weights through two device chunks copied on side "
            "streams (copy engines, double-buffered) instead of reading host memory zero-copy")
            .model(&M::offload_double_buffer),
        opt(kOffload, "write-combined", &T::write_combined, R::MayChange,
            "Allocate offload buffers write-combined (faster host-to-device)").model(&M::write_combined),
        opt(kOffload, "memcpy-all-gather", &T::memcpy_all_gather, R::MayChange,
            "GPU data parallel in threads mode: the copy-engine communicator (cudaMemcpy on the copy engines, sums by "
            "one rank-order kernel) instead of NCCL; also runs several ranks on one GPU (--gpu-ids=0,0)")
            .model(&M::memcpy_all_gather),

        // Multi-GPU
        opt(kMultiGpu, "gpus", &T::gpus, R::MustMatch,
            "Number of data-parallel ranks (ZeRO-1, ZeRO-2 with --zero-level=2 or ZeRO-3 with --zero-level=3; equal "
            "to one rank with that many times the accumulation). Started as threads of this process, or under "
            "`mpirun -np N train ...` one rank per process (then --gpus must be 1 or N). With --device=cpu the ranks "
            "are CPU reference models. On the GPU: one rank per GPU (--gpu-ids) over NCCL, or over the copy engines "
            "with --memcpy-all-gather; ZeRO-1 keeps 1/N of the master weights and Adam moments per rank, ZeRO-2 also "
            "1/N of the gradient, ZeRO-3 also 1/N of the weights").model(&M::gpus),
        opt(kMultiGpu, "gpu-ids", &T::gpu_ids, R::MayChange,
            "The CUDA device of each rank, comma-separated, one per rank (e.g. 0,1,2,3; repeats allowed: 0,0 puts two "
            "ranks on device 0). Default: rank r on device r in threads mode, each process's local rank "
            "(OMPI_COMM_WORLD_LOCAL_RANK) under mpirun. GPU only")
            .names(RunFlag::GpuIds),
        opt(kMultiGpu, "shard-weights", &T::shard_weights, R::MayChange,
            "Shard the weights over the ranks (ZeRO-3, as --zero-level=3: each rank holds 1/N of them and every layer "
            "is gathered from its owners just before it is used, in the forward and again in the backward); on one "
            "GPU: stream them from host (with --lora-rank: the frozen base; on the FP8 base with FP8 gradients only "
            "its e4m3 codes, which ZeRO-3 also shards and gathers instead of the bf16 weights)")
            .model(&M::shard_weights)
            .implying({turns_on(&T::shard_gradients, 1, true)}),
        opt(kMultiGpu, "shard-gradients", &T::shard_gradients, R::MayChange,
            "Shard gradients across GPUs (ZeRO-2, as --zero-level=2: each layer's gradient reduced to its owning rank "
            "during the backward); on one GPU: needs --offload-gradients").model(&M::shard_gradients),
        opt(kMultiGpu, "zero-level", &T::zero_level, R::MayChange,
            "ZeRO level with --gpus > 1, what each rank keeps 1/N of: 1 optimizer state, 2 + gradients, 3 + weights "
            "(LoRA: of the adapters, and 3 shards the frozen base on --device=cuda)",
            range(1, 3))
            .names(RunFlag::ZeroLevel)
            .implying({turns_on(&T::shard_gradients, 2), turns_on(&T::shard_weights, 3)}),
        opt(kMultiGpu, "comm-timeout", &T::comm_timeout, R::MayChange,
            "Seconds a data-parallel rank may go without finishing a micro-batch, the optimizer step or a round of "
            "evaluation before it decides a peer has died or hangs (a GPU collective waits forever otherwise): it says "
            "so, aborts its communicators and exits, and every rank does the same. 0 = never. Loading, checkpoints and "
            "the export are not timed",
            non_negative()),
        opt(kMultiGpu, "rendezvous-timeout", &T::rendezvous_timeout, R::MayChange,
            "Seconds a rank started by torchrun's or Slurm's variables waits for the others to join at "
            "MASTER_ADDR:MASTER_PORT, and any rank for the GPU communicator (NCCL) to be created, before it gives up "
            "naming the ranks that never came; never longer than --comm-timeout when that is set. Each rank says at "
            "once what it waits for and every 10 s how far it got. 0 = no limit. torchrun's own rendezvous waits "
            "600 s too",
            non_negative()),

        // Performance and memory
        opt(kPerf, "use-cuda-graphs", &T::use_cuda_graphs, R::MayChange,
            "Capture the steady-state step in a CUDA graph (bit-identical; also with --offload-residual and, on one "
            "GPU, --offload-gradients and --shard-weights, whose streaming gets one graph per state of its weight "
            "slots; not with --shard-weights over --gpus > 1)")
            .model(&M::use_cuda_graphs),
        opt(kPerf, "lmhead-chunks", &T::lmhead_chunks, R::MayChange,
            "Compute the LM head + loss in this many chunks of tokens").model(&M::lmhead_chunks),
        opt(kPerf, "attn-bwd-chunks", &T::attn_bwd_chunks, R::MayChange,
            "Run the attention backward in this many chunks of sequences (must divide --batch-size); its workspace "
            "holds one chunk").model(&M::attn_bwd_chunks),
        opt(kPerf, "attention", &T::attention, R::MayChange,
            "Attention kernels on the GPU: cudnn (cuDNN's fused flash attention, deterministic backward), flash "
            "(qtrain's own kernels) or auto (cudnn where this build and machine have it and --model-dtype=bf16, else "
            "flash)",
            choices({"auto", "flash", "cudnn"}))
            .model(&M::attention, [](const OptionSpec&, const T& o, const std::string&, M& m) {
                m.attention = o.attention == "flash"   ? AttentionImpl::Flash
                              : o.attention == "cudnn" ? AttentionImpl::Cudnn
                                                       : AttentionImpl::Auto;
            }),
        opt(kPerf, "max-docs-per-row", &T::max_docs_per_row, R::MayChange,
            "With --attention=cudnn and --document-masking: the documents a --seq-len row may hold. cuDNN runs each "
            "document as one sequence of a fixed-size ragged batch (batch size x this many), so a row with more "
            "is refused, and the backward's workspace grows with it (--attn-bwd-chunks divides it)",
            range(1, 4096))
            .model(&M::max_docs_per_row),
        // fast accumulation is less accurate (other products, not only another order of a sum): must match
        opt(kPerf, "fp8-fast-accum", &T::fp8_fast_accum, R::MustMatch,
            "FP8 GEMMs that use cuBLASLt's fast accumulation (partial sums kept at tensor-core precision, not promoted "
            "to fp32 every few blocks): off, forward (the forward products, as TransformerEngine does) or all; faster, "
            "slightly less accurate",
            choices({"off", "forward", "all"}))
            .model(&M::fp8_fast_accum, [](const OptionSpec&, const T& o, const std::string&, M& m) {
                m.fp8_fast_accum = o.fp8_fast_accum == "forward" ? Fp8FastAccum::Forward
                                   : o.fp8_fast_accum == "all"   ? Fp8FastAccum::All
                                                                 : Fp8FastAccum::Off;
            }),
        // bit-identical (a transpose moves the e4m3 bytes as they are) and no checkpoint holds Wᵀ: may change
        opt(kPerf, "fp8-weight-transposes", &T::fp8_weight_transposes, R::MayChange,
            "With FP8 gradients (--matmul-dtype=e4m3 --gradient-dtype=e4m3|e5m2, GPU): kept keeps two e4m3 copies of "
            "every layer matrix for the step, W for the forward and its transpose for the input-gradient GEMM; jit "
            "keeps only W, and the backward transposes each matrix into one scratch buffer (the largest layer "
            "matrix's bytes) right before its input-gradient GEMM. Saves one byte per parameter (the kept transposed copy "
            "spans them all: 13.8 GiB at 14B) less the scratch, costs one read and write of each matrix per backward (5.4 ms per backward at 7B on an H200, "
            "measured for LoRA's FP8 base, which always does this); bit-identical. Also with --shard-weights "
            "(the slots' transposed copies are dropped), CUDA graphs and recompute",
            choices({"kept", "jit"}))
            .model(&M::fp8_transposes_jit, [](const OptionSpec&, const T& o, const std::string&, M& m) {
                m.fp8_transposes_jit = o.fp8_weight_transposes == "jit";
            }),
        opt(kPerf, "gemm-autotune", &T::gemm_autotune, R::MayChange,
            "Try cuBLASLt's candidate algorithms for each GEMM shape on the step's own calls, timed in place, and keep "
            "the fastest (decided within ~25 steps; CUDA graphs are captured after that); runs are then reproducible "
            "only to the last bits").model(&M::gemm_autotune),
        opt(kPerf, "memory-limit", &T::memory_limit, R::MayChange,
            "Cap the memory plan, e.g. 24GiB (rehearse a smaller card)")
            .model(&M::memory_limit, [](const OptionSpec& spec, const T& o, const std::string&, M& m) {
                m.memory_limit = o.memory_limit.empty() ? 0 : parse_bytes(o.memory_limit, flag_name(spec));
            }),
        opt(kPerf, "host-memory-limit", &T::host_memory_limit, R::MayChange,
            "Cap the pinned host memory of the plan, e.g. 64GiB (default for a training run: this machine's RAM, or its "
            "container's memory limit if lower, less 5%, at least 4 GiB kept free; --plan-only checks only an explicit "
            "limit)"),
        opt(kPerf, "plan-only", &T::plan_only, R::Invocation,
            "Print the memory plan and exit (works without a GPU); with --memory-limit, also the largest --batch-size "
            "that fits (streamed runs: also with --offload-residual)"),

        // Optimisation
        opt(kOptim, "steps", &T::steps, R::MayChange, "Number of optimizer steps"),
        opt(kOptim, "grad-accumulation", &T::grad_accumulation, R::MustMatch, "Micro-batches per optimizer step"),
        opt(kOptim, "learning-rate,lr", &T::learning_rate, R::MustMatch, "Peak learning rate"),
        opt(kOptim, "lr-schedule", &T::lr_schedule, R::MustMatch, "Decay after warmup: cosine|linear",
            choices({"cosine", "linear"})),
        // -1 = min(100, --steps/10): a longer run would move the warmup's end, so compared resolved
        opt(kOptim, "warmup", &T::warmup, R::Resolved, "Linear warmup steps (default: min(100, steps/10))"),
        opt(kOptim, "cooldown", &T::cooldown, R::MustMatch, "Final steps with a 1-sqrt decay of the learning rate"),
        opt(kOptim, "final-lr-fraction", &T::final_lr_fraction, R::MustMatch,
            "Learning rate at the end of the decay, as a fraction of the peak"),
        opt(kOptim, "weight-decay", &T::weight_decay, R::MustMatch,
            "AdamW decoupled weight decay (matrices and embeddings only)"),
        opt(kOptim, "grad-clip", &T::grad_clip, R::MustMatch,
            "Clip the global gradient norm to this value (0 = off)"),
        opt(kOptim, "beta-1", &T::beta_1, R::MustMatch, "Adam beta1"),
        opt(kOptim, "beta-2", &T::beta_2, R::MustMatch, "Adam beta2"),
        opt(kOptim, "adam-epsilon", &T::adam_epsilon, R::MustMatch, "Adam epsilon"),
        opt(kOptim, "seed", &T::seed, R::MustMatch, "Seed for initialisation and data order"),

        // LoRA: one setter fills ModelOptions::lora from all five (checked in TrainOptions::validate)
        opt(kLora, "lora-rank", &T::lora_rank, R::MustMatch,
            "Train LoRA adapters of this rank on a frozen base (0 = off: full training): each target Linear gets "
            "alpha/rank * x A^T B^T, only A and B have gradients, master weights and Adam moments. --device=cpu, or "
            "--device=cuda with the base resident in the model dtype (or streamed from host with --shard-weights on "
            "one GPU); with --gpus=N every rank holds the base and the adapters, and the adapters' optimizer state is "
            "sharded: ZeRO-1 all-reduces their gradient, ZeRO-2 (--zero-level=2) reduce-scatters it (the same bits); "
            "--zero-level=3 is ZeRO-2 of the adapters, with the base whole on every rank on --device=cpu and sharded "
            "on --device=cuda (each rank keeps 1/N of the bf16 base, or of the FP8 base's e4m3 codes, and gathers "
            "each layer as it is used; the same bits as ZeRO-1/2). "
            "With --matmul-dtype=e4m3 the base is FP8: its matrices quantised to e4m3 once after the load, its GEMMs "
            "FP8 (input gradient only), the adapters' GEMMs in bf16 on the unquantised inputs. With "
            "--gradient-dtype=e4m3|e5m2 the GPU keeps only the e4m3 copies of the layer matrices (a memory saving: "
            "the plan shows it); with bf16 gradients it keeps the bf16 base too (its input-gradient GEMMs read it). "
            "--merge-lora merges into the bf16 base, read from --model",
            non_negative())
            .model([](const OptionSpec&, const T& o, const std::string&, M& m) {
                m.lora.rank = o.lora_rank;
                m.lora.alpha = o.lora_alpha;
                m.lora.dropout = o.lora_dropout;
                m.lora.targets = parse_lora_targets(o.lora_targets, "--lora-targets");
                m.lora.init = o.lora_init;
                m.lora.seed = o.seed;
                m.lora.base_model = o.model;
                m.lora.train_also = parse_lora_train_also(o.train_also, "--train-also");
            })
            .names(&LoraOptions::rank),
        opt(kLora, "lora-alpha", &T::lora_alpha, R::MustMatch,
            "LoRA scaling numerator: the adapters' output is multiplied by alpha / rank (PEFT's lora_alpha, default 8 "
            "as PEFT's)")
            .names(&LoraOptions::alpha),
        opt(kLora, "lora-dropout", &T::lora_dropout, R::MustMatch,
            "Dropout on the adapters' input in training (PEFT's lora_dropout), in [0, 1); its masks come from --seed "
            "and the pass, so runs and resumes reproduce them")
            .names(&LoraOptions::dropout),
        opt(kLora, "lora-targets", &T::lora_targets, R::MustMatch,
            "The projections that get adapters: all, or any of q,k,v,o,gate,up,down, comma-separated (PEFT's "
            "target_modules q_proj, ..., down_proj)")
            .names(&LoraOptions::targets),
        opt(kLora, "lora-init", &T::lora_init, R::MustMatch,
            "Adapter initialisation: kaiming (PEFT's default: A Kaiming-uniform as torch's kaiming_uniform_(a=sqrt(5)), "
            "B zero) or gaussian (PEFT's init_lora_weights=\"gaussian\": A ~ N(0, 1/rank), B zero)",
            choices({"kaiming", "gaussian"}))
            .names(&LoraOptions::init),
        opt(kLora, "train-also", &T::train_also, R::MustMatch,
            "With --lora-rank: also train these base tensors in full (fp32 master, AdamW moments, clipped with the "
            "adapters): norms (every RMSNorm weight: the layers' two, q/k norms where the family has them, the final "
            "norm) and/or embeddings (embed_tokens and lm_head; one matrix when tied), comma-separated. The adapter "
            "names them in modules_to_save as PEFT does. With --lm-head-dtype=e4m3 the trained head's FP8 copy is "
            "made again after every update; with --shard-weights on one GPU the streamed bf16 base's host copy is "
            "written; at ZeRO-3 of the bf16 base (--gpus>1 --shard-weights) each rank writes its block's part")
            .names(&LoraOptions::train_also),
        // where the adapters start and what the export is: not the math of the steps
        opt(kLora, "lora-from", &T::lora_from, R::MayChange,
            "Start from this PEFT adapter directory (adapter_config.json + adapter_model.safetensors) instead of "
            "fresh adapters; its rank, alpha, targets and shapes must be this run's")
            .model([](const OptionSpec&, const T& o, const std::string&, M& m) { m.lora.from = o.lora_from; })
            .names(&LoraOptions::from),
        opt(kLora, "merge-lora", &T::merge_lora, R::MayChange,
            "With --lora-rank: --out-dir gets the merged full model (W + alpha/rank * B A, as PEFT's "
            "merge_and_unload; model.safetensors and config.json) instead of the PEFT adapter. With --export-checkpoint of "
            "a LoRA checkpoint and --model=BASE (the base the run trained on): the checkpoint's adapters merged into "
            "BASE")
            .model([](const OptionSpec&, const T& o, const std::string&, M& m) { m.lora.merge = o.merge_lora; })
            .names(&LoraOptions::merge),

        // Evaluation, checkpoints and output
        opt(kOutput, "eval-every-n-steps", &T::eval_every_n_steps, R::MayChange,
            "Evaluate every N optimizer steps (0 = only at the end)"),
        opt(kOutput, "eval-num-steps", &T::eval_num_steps, R::MayChange,
            "Batches per evaluation (0 = the whole eval set)"),
        opt(kOutput, "ckpt-interval", &T::ckpt_interval, R::MayChange,
            "Write a checkpoint every N optimizer steps (0 = never)"),
        opt(kOutput, "ckpt-keep", &T::ckpt_keep, R::MayChange,
            "After writing a checkpoint, keep only the newest N complete ones in --checkpoint-dir and remove the older "
            "(0 = keep all)"),
        opt(kOutput, "checkpoint-dir", &T::checkpoint_dir, R::MayChange,
            "Directory for checkpoints (step_XXXXXXXX/ inside)"),
        // `continue` is a Python keyword; the package's keyword is the field's name
        opt(kOutput, "continue", &T::continue_from_checkpoint, R::Invocation,
            "Resume from the latest complete checkpoint in --checkpoint-dir. The run must be the same: options that "
            "change the math or the data (model, batch, sequence length, accumulation, seed, dtypes, data files, "
            "learning-rate schedule, optimizer) are compared with the checkpoint's and a difference is refused. May "
            "change: --steps (extends or shortens the run; the schedule is recomputed over the new total, so steps "
            "after the resume point follow the new decay), evaluation, checkpoint and output paths and intervals, "
            "memory flags (recompute, offload, streaming, chunks, CUDA graphs)",
            {}, "continue_from_checkpoint"),
        opt(kOutput, "force-resume", &T::force_resume, R::Invocation,
            "With --continue: resume even though options that change the run differ from the checkpoint's (each "
            "difference is printed and logged), e.g. a lower --learning-rate after a divergence"),
        opt(kOutput, "overwrite", &T::overwrite, R::Invocation,
            "Start from step 0 even though --checkpoint-dir holds another run's checkpoints (they are removed) or "
            "--out-dir / --log-file hold another run's model or log (replaced); without it such a start is refused"),
        opt(kOutput, "out-dir", &T::out_dir, R::MayChange,
            "Where the final model.safetensors and config.json go (and the tokenizer files)"),
        opt(kOutput, "export-checkpoint", &T::export_checkpoint, R::NotRecorded,
            "Write the HF model (model.safetensors, config.json) of this checkpoint directory (a step_XXXXXXXX of "
            "--checkpoint-dir) into --out-dir and exit, without training; its checksums are verified first. Needs no "
            "--model or --train-file (the checkpoint has the config)"),
        opt(kOutput, "log-file", &T::log_file, R::MayChange, "JSON Lines log (default: <out-dir>/log.jsonl)"),
    };
}

// The table, with its names registered for the models' messages (model/flag_names.h).
std::vector<OptionSpec> make_registered_table() {
    std::vector<OptionSpec> table = make_table();
    for (const OptionSpec& spec : table)
        if (spec.model_flag) register_flag_name(*spec.model_flag, flag_name(spec));
    return table;
}

}  // namespace

const std::vector<OptionSpec>& train_option_table() {
    static const std::vector<OptionSpec> table = make_registered_table();
    return table;
}

const OptionSpec* find_train_option(std::string_view name) {
    for (const OptionSpec& spec : train_option_table())
        if (spec.name == name) return &spec;
    return nullptr;
}

const OptionSpec& train_option_of(const OptionMember& member) {
    for (const OptionSpec& spec : train_option_table())
        if (spec.member == member) return spec;
    throw std::logic_error("option table: a TrainOptions field without an entry");
}

std::string flag_name(const OptionSpec& spec) { return "--" + spec.name; }

TrainOptions with_implications(TrainOptions o) {
    // to a fixed point: --recompute-block turns on --recompute-ffn, which turns on --recompute-swiglu
    for (bool changed = true; changed;) {
        changed = false;
        for (const OptionSpec& spec : train_option_table())
            for (const OptionImplication& i : spec.implies) {
                const double value = std::visit(
                    [&](auto member) {
                        const auto& field = o.*member;
                        if constexpr (std::is_arithmetic_v<std::decay_t<decltype(field)>>)
                            return static_cast<double>(field);
                        else
                            return 0.0;  // a text flag implies nothing
                    },
                    spec.member);
                if (value >= i.from && (!i.several_ranks || o.gpus > 1) && !(o.*i.flag)) {
                    o.*i.flag = true;
                    changed = true;
                }
            }
    }
    return o;
}

const char* resume_rule_name(ResumeRule rule) {
    switch (rule) {
        case ResumeRule::MustMatch: return "must-match";
        case ResumeRule::MayChange: return "may-change";
        case ResumeRule::Invocation: return "invocation";
        case ResumeRule::Resolved: return "resolved";
        case ResumeRule::NotRecorded: return "not-recorded";
    }
    return "?";
}

}  // namespace qtrain
