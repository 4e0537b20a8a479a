#include "train/train_options.h"

#include <cmath>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "train/rank_devices.h"

namespace qtrain {

namespace {

// Every flag is registered once, here, with its help text, so `--help`, the README table
// (scripts/check_readme_flags.sh compares them) and to_json() cannot drift apart.
void add_flags(CLI::App& app, TrainOptions& o) {
    auto* g = app.add_option_group("Model");
    g->add_option("--model", o.model, "HF model directory, org/name in the local HF cache, or a preset (Qwen2.5-0.5B ... Qwen2.5-32B)");
    g->add_flag("--from-scratch", o.from_scratch, "Random initialisation instead of loading weights (shape from --model)");
    g->add_option("--tokenizer", o.tokenizer,
                  "The data's tokenizer (what tokenize --tokenizer took: tokenizer.json, qwen.tiktoken, a model "
                  "directory or a model in the local HF cache); its HF tokenizer files go to --out-dir with the "
                  "model (default: those in --model's directory, if any)");
    g->add_option("--device", o.device, "Where to train: auto (GPU if present), cpu (reference model) or cuda")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));

    g = app.add_option_group("Data");
    g->add_option("--train-file", o.train_file, "Training token file(s), BIN.TOK format; a glob (quote it)");
    g->add_option("--eval-file", o.eval_file, "Evaluation token file(s); a glob");
    g->add_option("--batch-size,--batch", o.batch_size, "Micro-batch size (sequences per GPU per micro-step)");
    g->add_option("--seq-len", o.seq_len, "Sequence length in tokens");

    g = app.add_option_group("Precision");
    g->add_option("--model-dtype", o.model_dtype, "Weights and activations: fp32|bf16 (default: fp32 on cpu, bf16 on cuda)");
    g->add_option("--matmul-dtype", o.matmul_dtype, "Matmul inputs: fp32|bf16|e4m3 (default: the model dtype)");
    g->add_option("--gradient-dtype", o.gradient_dtype, "Activation gradients into matmuls: fp32|bf16|e4m3|e5m2 (default: the matmul dtype; bf16 when matmuls are fp8)");
    g->add_option("--opt-m-dtype", o.opt_m_dtype, "Adam first moment: fp32|bf16 (bf16 uses stochastic rounding)");
    g->add_option("--opt-v-dtype", o.opt_v_dtype, "Adam second moment: fp32|bf16 (bf16 uses stochastic rounding)");
    g->add_option("--master-dtype", o.master_dtype, "Master weights: fp32|bf16. bf16 (with --model-dtype=bf16, GPU): no fp32 copy, AdamW updates the bf16 weights with stochastic rounding; saves 4 bytes per parameter");
    g->add_option("--param-grad-dtype", o.param_grad_dtype, "Accumulated parameter gradients: fp32|bf16. bf16 needs --offload-gradients (GPU): the host copy is bf16, summed over micro-batches with stochastic rounding; saves 2 bytes per parameter of pinned memory");

    g = app.add_option_group("Recompute");
    g->add_flag("--recompute-swiglu", o.recompute_swiglu, "Recompute the SwiGLU activation in the backward pass");
    g->add_flag("--recompute-norm", o.recompute_norm, "Recompute RMSNorm outputs in the backward pass");
    g->add_flag("--recompute-qkv", o.recompute_qkv, "Recompute the QKV projection in the backward pass");
    g->add_flag("--recompute-ffn", o.recompute_ffn, "Recompute the whole feed-forward block (implies --recompute-swiglu)");
    g->add_flag("--recompute-att", o.recompute_att, "Recompute the whole attention block (implies --recompute-qkv)");
    g->add_flag("--recompute-block", o.recompute_block, "Recompute the whole transformer block (implies all of the above)");

    g = app.add_option_group("Offload");
    g->add_flag("--offload-residual", o.offload_residual, "Keep the residual stream of each layer in pinned host memory");
    g->add_flag("--offload-master", o.offload_master, "Keep master weights in pinned host memory");
    g->add_flag("--offload-opt-m", o.offload_opt_m, "Keep Adam's first moment in pinned host memory");
    g->add_flag("--offload-opt-v", o.offload_opt_v, "Keep Adam's second moment in pinned host memory");
    g->add_flag("--offload-quants", o.offload_quants, "Keep the FP8 copies of streamed layers (--persistent-quants) in pinned host memory instead of on the GPU (implies --persistent-quants; needs --shard-weights)");
    g->add_flag("--offload-gradients", o.offload_gradients, "Keep (sharded) gradients in pinned host memory (untied models: the embedding's gradient is summed there directly, so no [vocab, hidden] fp32 table stays on the GPU)");
    g->add_flag("--persistent-quants", o.persistent_quants, "With --shard-weights and FP8 (e4m3 matmuls, e4m3|e5m2 gradients): quantise each streamed layer once per optimizer step and keep its FP8 copy, so later passes move 1 byte per weight instead of 2 (resident FP8 weights are always kept)");
    g->add_flag("--offload-double-buffer", o.offload_double_buffer, "The optimizer stages offloaded master/moments/gradients/weights through two device chunks copied on side streams (copy engines, double-buffered) instead of reading host memory zero-copy");
    g->add_flag("--write-combined", o.write_combined, "Allocate offload buffers write-combined (faster host-to-device)");
    g->add_flag("--memcpy-all-gather", o.memcpy_all_gather,
                "GPU data parallel in threads mode: the copy-engine communicator (cudaMemcpy on the copy engines, sums by "
                "one rank-order kernel) instead of NCCL; also runs several ranks on one GPU (--gpu-ids=0,0)");

    g = app.add_option_group("Multi-GPU");
    g->add_option("--gpus", o.gpus, "Number of data-parallel ranks (ZeRO-1, ZeRO-2 with --zero-level=2 or ZeRO-3 "
                  "with --zero-level=3; equal to one rank with that many times the accumulation). Started as threads "
                  "of this process, or under `mpirun -np N train ...` one rank per process (then --gpus must be 1 or "
                  "N). With --device=cpu the ranks are CPU reference models. On the GPU: one rank per GPU (--gpu-ids) "
                  "over NCCL, or over the copy engines with --memcpy-all-gather; ZeRO-1 keeps 1/N of the master "
                  "weights and Adam moments per rank, ZeRO-2 also 1/N of the gradient, ZeRO-3 also 1/N of the "
                  "weights");
    g->add_option("--gpu-ids", o.gpu_ids, "The CUDA device of each rank, comma-separated, one per rank (e.g. 0,1,2,3; "
                  "repeats allowed: 0,0 puts two ranks on device 0). Default: rank r on device r in threads mode, "
                  "each process's local rank (OMPI_COMM_WORLD_LOCAL_RANK) under mpirun. GPU only");
    g->add_flag("--shard-weights", o.shard_weights, "Shard the weights over the ranks (ZeRO-3, as --zero-level=3: "
                "each rank holds 1/N of them and every layer is gathered from its owners just before it is used, in "
                "the forward and again in the backward); on one GPU: stream them from host");
    g->add_flag("--shard-gradients", o.shard_gradients, "Shard gradients across GPUs (ZeRO-2, as --zero-level=2: each "
                "layer's gradient reduced to its owning rank during the backward); on one GPU: needs --offload-gradients");
    g->add_option("--zero-level", o.zero_level, "ZeRO level with --gpus > 1, what each rank keeps 1/N of: 1 optimizer "
                  "state, 2 + gradients, 3 + weights")
        ->check(CLI::Range(1, 3));
    g->add_option("--comm-timeout", o.comm_timeout, "Seconds a data-parallel rank may go without finishing a micro-batch, "
                  "the optimizer step or a round of evaluation before it decides a peer has died or hangs (a GPU collective waits "
                  "forever otherwise): it says so, aborts its communicators and exits, and every rank does the same. "
                  "0 = never. Loading, checkpoints and the export are not timed")
        ->check(CLI::NonNegativeNumber);

    g = app.add_option_group("Performance and memory");
    g->add_flag("--use-cuda-graphs", o.use_cuda_graphs, "Capture the steady-state step in a CUDA graph");
    g->add_option("--lmhead-chunks", o.lmhead_chunks, "Compute the LM head + loss in this many chunks of tokens");
    g->add_option("--attn-bwd-chunks", o.attn_bwd_chunks,
                  "Run the attention backward in this many chunks of sequences (must divide --batch-size); "
                  "its workspace holds one chunk");
    g->add_option("--attention", o.attention,
                  "Attention kernels on the GPU: cudnn (cuDNN's fused flash attention, deterministic backward), "
                  "flash (qtrain's own kernels) or auto (cudnn where this build and machine have it and "
                  "--model-dtype=bf16, else flash)")
        ->check(CLI::IsMember({"auto", "flash", "cudnn"}));
    g->add_option("--fp8-fast-accum", o.fp8_fast_accum,
                  "FP8 GEMMs that use cuBLASLt's fast accumulation (partial sums kept at tensor-core precision, "
                  "not promoted to fp32 every few blocks): off, forward (the forward products, as "
                  "TransformerEngine does) or all; faster, slightly less accurate")
        ->check(CLI::IsMember({"off", "forward", "all"}));
    g->add_flag("--gemm-autotune", o.gemm_autotune,
                "Try cuBLASLt's candidate algorithms for each GEMM shape on the step's own calls, timed in place, "
                "and keep the fastest (decided within ~25 steps; CUDA graphs are captured after that); runs are "
                "then reproducible only to the last bits");
    g->add_option("--memory-limit", o.memory_limit, "Cap the memory plan, e.g. 24GiB (rehearse a smaller card)");
    g->add_option("--host-memory-limit", o.host_memory_limit, "Cap the pinned host memory of the plan, e.g. 64GiB (default for a training run: this machine's RAM, or its container's memory limit if lower, less 5%, at least 4 GiB kept free; --plan-only checks only an explicit limit)");
    g->add_flag("--plan-only", o.plan_only, "Print the memory plan and exit (works without a GPU); with --memory-limit, also the largest --batch-size that fits (streamed runs: also with --offload-residual)");

    g = app.add_option_group("Optimisation");
    g->add_option("--steps", o.steps, "Number of optimizer steps");
    g->add_option("--grad-accumulation", o.grad_accumulation, "Micro-batches per optimizer step");
    g->add_option("--learning-rate,--lr", o.learning_rate, "Peak learning rate");
    g->add_option("--lr-schedule", o.lr_schedule, "Decay after warmup: cosine|linear")
        ->check(CLI::IsMember({"cosine", "linear"}));
    g->add_option("--warmup", o.warmup, "Linear warmup steps (default: min(100, steps/10))");
    g->add_option("--cooldown", o.cooldown, "Final steps with a 1-sqrt decay of the learning rate");
    g->add_option("--final-lr-fraction", o.final_lr_fraction, "Learning rate at the end of the decay, as a fraction of the peak");
    g->add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (matrices and embeddings only)");
    g->add_option("--grad-clip", o.grad_clip, "Clip the global gradient norm to this value (0 = off)");
    g->add_option("--beta-1", o.beta_1, "Adam beta1");
    g->add_option("--beta-2", o.beta_2, "Adam beta2");
    g->add_option("--adam-epsilon", o.adam_epsilon, "Adam epsilon");
    g->add_option("--seed", o.seed, "Seed for initialisation and data order");

    g = app.add_option_group("Evaluation, checkpoints and output");
    g->add_option("--eval-every-n-steps", o.eval_every_n_steps, "Evaluate every N optimizer steps (0 = only at the end)");
    g->add_option("--eval-num-steps", o.eval_num_steps, "Batches per evaluation (0 = the whole eval set)");
    g->add_option("--ckpt-interval", o.ckpt_interval, "Write a checkpoint every N optimizer steps (0 = never)");
    g->add_option("--ckpt-keep", o.ckpt_keep,
                  "After writing a checkpoint, keep only the newest N complete ones in --checkpoint-dir and "
                  "remove the older (0 = keep all)");
    g->add_option("--checkpoint-dir", o.checkpoint_dir, "Directory for checkpoints (step_XXXXXXXX/ inside)");
    g->add_flag("--continue", o.continue_from_checkpoint,
                "Resume from the latest complete checkpoint in --checkpoint-dir. The run must be the same: options "
                "that change the math or the data (model, batch, sequence length, accumulation, seed, dtypes, data "
                "files, learning-rate schedule, optimizer) are compared with the checkpoint's and a difference is "
                "refused. May change: --steps (extends or shortens the run; the schedule is recomputed over the new "
                "total, so steps after the resume point follow the new decay), evaluation, checkpoint and output "
                "paths and intervals, memory flags (recompute, offload, streaming, chunks, CUDA graphs)");
    g->add_flag("--force-resume", o.force_resume,
                "With --continue: resume even though options that change the run differ from the checkpoint's "
                "(each difference is printed and logged), e.g. a lower --learning-rate after a divergence");
    g->add_flag("--overwrite", o.overwrite,
                "Start from step 0 even though --checkpoint-dir holds another run's checkpoints (they are removed) "
                "or, with --continue and no checkpoint, --out-dir holds another run's log or model (replaced)");
    g->add_option("--out-dir", o.out_dir, "Where the final model.safetensors and config.json go (and the tokenizer files)");
    g->add_option("--export-checkpoint", o.export_checkpoint,
                  "Write the HF model (model.safetensors, config.json) of this checkpoint directory (a step_XXXXXXXX "
                  "of --checkpoint-dir) into --out-dir and exit, without training; its checksums are verified first. "
                  "Needs no --model or --train-file (the checkpoint has the config)");
    g->add_option("--log-file", o.log_file, "JSON Lines log (default: <out-dir>/log.jsonl)");
}

DType dtype_flag(const std::string& value, const char* flag, const char* allowed) {
    return parse_dtype(value, flag, allowed);
}

}  // namespace

void TrainOptions::validate(bool need_train_file) const {
    if (!export_checkpoint.empty()) return;  // needs only --out-dir (checkpoint_export.h)
    QT_CHECK(!model.empty(), "--model is required (a HF directory, org/name in the local HF cache, or a preset like Qwen2.5-0.5B with --from-scratch)");
    QT_CHECK(batch_size > 0, "--batch-size must be positive, got ", batch_size);
    QT_CHECK(seq_len > 1, "--seq-len must be at least 2, got ", seq_len);
    QT_CHECK(grad_accumulation > 0, "--grad-accumulation must be positive, got ", grad_accumulation);
    QT_CHECK(steps >= 0, "--steps must be >= 0, got ", steps);
    // CLI11 parses "inf" and "nan" as floats; neither is a usable hyper-parameter
    const std::pair<const char*, float> reals[] = {
        {"--learning-rate", learning_rate}, {"--final-lr-fraction", final_lr_fraction}, {"--weight-decay", weight_decay},
        {"--grad-clip", grad_clip},         {"--beta-1", beta_1},                       {"--beta-2", beta_2},
        {"--adam-epsilon", adam_epsilon}};
    for (const auto& [flag, value] : reals) QT_CHECK(std::isfinite(value), flag, " must be a finite number, got ", value);
    QT_CHECK(learning_rate >= 0, "--learning-rate must be >= 0, got ", learning_rate);
    QT_CHECK(warmup >= -1, "--warmup must be >= 0, got ", warmup);
    QT_CHECK(cooldown >= 0 && cooldown <= steps, "--cooldown must be in [0, --steps=", steps, "], got ", cooldown);
    QT_CHECK(final_lr_fraction >= 0 && final_lr_fraction <= 1, "--final-lr-fraction must be in [0, 1], got ", final_lr_fraction);
    QT_CHECK(weight_decay >= 0, "--weight-decay must be >= 0, got ", weight_decay);
    QT_CHECK(grad_clip >= 0, "--grad-clip must be >= 0, got ", grad_clip);
    QT_CHECK(beta_1 >= 0 && beta_1 < 1, "--beta-1 must be in [0, 1), got ", beta_1);
    QT_CHECK(beta_2 >= 0 && beta_2 < 1, "--beta-2 must be in [0, 1), got ", beta_2);
    QT_CHECK(adam_epsilon > 0, "--adam-epsilon must be positive, got ", adam_epsilon);
    QT_CHECK(eval_every_n_steps >= 0, "--eval-every-n-steps must be >= 0, got ", eval_every_n_steps);
    QT_CHECK(eval_num_steps >= 0, "--eval-num-steps must be >= 0, got ", eval_num_steps);
    QT_CHECK(ckpt_interval >= 0, "--ckpt-interval must be >= 0, got ", ckpt_interval);
    QT_CHECK(ckpt_keep >= 0, "--ckpt-keep must be >= 0 (0 = keep all), got ", ckpt_keep);
    QT_CHECK(lmhead_chunks > 0, "--lmhead-chunks must be positive, got ", lmhead_chunks);
    QT_CHECK(attn_bwd_chunks > 0, "--attn-bwd-chunks must be positive, got ", attn_bwd_chunks);
    QT_CHECK(gpus >= 0, "--gpus must be >= 0, got ", gpus);
    if (!gpu_ids.empty()) (void)parse_gpu_ids(gpu_ids);
    QT_CHECK(!out_dir.empty(), "--out-dir must not be empty");
    QT_CHECK(!checkpoint_dir.empty(), "--checkpoint-dir must not be empty (it is where checkpoints go, default ckpt)");
    QT_CHECK(!force_resume || continue_from_checkpoint, "--force-resume only applies with --continue");
    if (!plan_only && need_train_file) QT_CHECK(!train_file.empty(), "--train-file is required (a BIN.TOK file or glob; build/tokenize makes them)");
    if (!memory_limit.empty()) (void)parse_bytes(memory_limit, "--memory-limit");
    if (!host_memory_limit.empty()) (void)parse_bytes(host_memory_limit, "--host-memory-limit");
}

ModelOptions TrainOptions::model_options(const std::string& dev) const {
    ModelOptions m;
    m.batch_size = batch_size;
    m.seq_len = seq_len;
    const std::string model_dt = model_dtype.empty() ? (dev == "cpu" ? "fp32" : "bf16") : model_dtype;
    m.model_dtype = dtype_flag(model_dt, "--model-dtype", "fp32|bf16");
    m.matmul_dtype = matmul_dtype.empty() ? m.model_dtype : dtype_flag(matmul_dtype, "--matmul-dtype", "fp32|bf16|e4m3");
    if (!gradient_dtype.empty()) m.gradient_dtype = dtype_flag(gradient_dtype, "--gradient-dtype", "fp32|bf16|e4m3|e5m2");
    else m.gradient_dtype = (m.matmul_dtype == DType::E4M3) ? DType::BF16 : m.matmul_dtype;
    m.opt_m_dtype = dtype_flag(opt_m_dtype, "--opt-m-dtype", "fp32|bf16");
    m.opt_v_dtype = dtype_flag(opt_v_dtype, "--opt-v-dtype", "fp32|bf16");
    m.master_dtype = dtype_flag(master_dtype, "--master-dtype", "fp32|bf16");
    m.param_grad_dtype = dtype_flag(param_grad_dtype, "--param-grad-dtype", "fp32|bf16");

    // implications, as in the seed design's table
    m.recompute_block = recompute_block;
    m.recompute_ffn = recompute_ffn || recompute_block;
    m.recompute_att = recompute_att || recompute_block;
    m.recompute_swiglu = recompute_swiglu || m.recompute_ffn;
    m.recompute_qkv = recompute_qkv || m.recompute_att;
    m.recompute_norm = recompute_norm || recompute_block;

    m.offload_residual = offload_residual;
    m.offload_master = offload_master;
    m.offload_opt_m = offload_opt_m;
    m.offload_opt_v = offload_opt_v;
    m.offload_quants = offload_quants;
    m.offload_gradients = offload_gradients;
    m.offload_double_buffer = offload_double_buffer;
    m.persistent_quants = persistent_quants;
    m.write_combined = write_combined;
    m.memcpy_all_gather = memcpy_all_gather;
    m.zero_level = zero_level;
    m.shard_weights = shard_weights || zero_level >= 3;
    // with several ranks --shard-weights is ZeRO-3, which shards the gradients too (on one GPU it
    // streams the weights from host memory and leaves the gradients alone)
    m.shard_gradients = shard_gradients || zero_level >= 2 || (m.shard_weights && gpus > 1);
    m.gpus = gpus;
    m.use_cuda_graphs = use_cuda_graphs;
    m.lmhead_chunks = lmhead_chunks;
    m.attn_bwd_chunks = attn_bwd_chunks;
    m.attention = attention == "flash" ? AttentionImpl::Flash : attention == "cudnn" ? AttentionImpl::Cudnn : AttentionImpl::Auto;
    m.fp8_fast_accum = fp8_fast_accum == "forward" ? Fp8FastAccum::Forward
                       : fp8_fast_accum == "all"   ? Fp8FastAccum::All
                                                   : Fp8FastAccum::Off;
    m.gemm_autotune = gemm_autotune;
    m.memory_limit = memory_limit.empty() ? 0 : parse_bytes(memory_limit, "--memory-limit");
    return m;
}

std::string TrainOptions::to_json() const {
    // Round-trip through CLI11's own view of the options so every flag appears under its name.
    TrainOptions copy = *this;
    CLI::App app;
    add_flags(app, copy);
    nlohmann::json j = nlohmann::json::object();
    for (const CLI::Option* opt : app.get_options([](const CLI::Option* o) { return !o->get_lnames().empty(); })) {
        const std::string name = opt->get_lnames().front();
        if (name == "help") continue;
        // reconstruct the current value as text
        j[name] = nullptr;
    }
    // Fill values explicitly (CLI11 does not expose bound variables generically).
    j["model"] = model; j["tokenizer"] = tokenizer; j["from-scratch"] = from_scratch; j["device"] = device;
    j["train-file"] = train_file; j["eval-file"] = eval_file;
    j["batch-size"] = batch_size; j["seq-len"] = seq_len;
    j["model-dtype"] = model_dtype; j["matmul-dtype"] = matmul_dtype; j["gradient-dtype"] = gradient_dtype;
    j["opt-m-dtype"] = opt_m_dtype; j["opt-v-dtype"] = opt_v_dtype; j["master-dtype"] = master_dtype;
    j["param-grad-dtype"] = param_grad_dtype;
    j["recompute-swiglu"] = recompute_swiglu; j["recompute-norm"] = recompute_norm; j["recompute-qkv"] = recompute_qkv;
    j["recompute-ffn"] = recompute_ffn; j["recompute-att"] = recompute_att; j["recompute-block"] = recompute_block;
    j["offload-residual"] = offload_residual; j["offload-master"] = offload_master;
    j["offload-opt-m"] = offload_opt_m; j["offload-opt-v"] = offload_opt_v; j["offload-quants"] = offload_quants;
    j["offload-gradients"] = offload_gradients; j["offload-double-buffer"] = offload_double_buffer; j["persistent-quants"] = persistent_quants;
    j["write-combined"] = write_combined; j["memcpy-all-gather"] = memcpy_all_gather;
    j["gpus"] = gpus; j["gpu-ids"] = gpu_ids; j["shard-weights"] = shard_weights; j["shard-gradients"] = shard_gradients; j["zero-level"] = zero_level; j["comm-timeout"] = comm_timeout;
    j["use-cuda-graphs"] = use_cuda_graphs; j["lmhead-chunks"] = lmhead_chunks; j["attn-bwd-chunks"] = attn_bwd_chunks;
    j["attention"] = attention; j["fp8-fast-accum"] = fp8_fast_accum; j["gemm-autotune"] = gemm_autotune;
    j["memory-limit"] = memory_limit; j["host-memory-limit"] = host_memory_limit; j["plan-only"] = plan_only;
    j["steps"] = steps; j["grad-accumulation"] = grad_accumulation; j["learning-rate"] = learning_rate;
    j["lr-schedule"] = lr_schedule; j["warmup"] = warmup; j["cooldown"] = cooldown;
    j["final-lr-fraction"] = final_lr_fraction; j["weight-decay"] = weight_decay; j["grad-clip"] = grad_clip;
    j["beta-1"] = beta_1; j["beta-2"] = beta_2; j["adam-epsilon"] = adam_epsilon; j["seed"] = seed;
    j["eval-every-n-steps"] = eval_every_n_steps; j["eval-num-steps"] = eval_num_steps;
    j["ckpt-interval"] = ckpt_interval; j["ckpt-keep"] = ckpt_keep; j["checkpoint-dir"] = checkpoint_dir; j["continue"] = continue_from_checkpoint;
    j["overwrite"] = overwrite; j["force-resume"] = force_resume;
    j["out-dir"] = out_dir; j["log-file"] = log_file;
    for (auto it = j.begin(); it != j.end(); ++it)
        QT_CHECK(!it.value().is_null(), "internal: flag --", it.key(), " is missing from TrainOptions::to_json");
    return j.dump();
}

namespace {

void configure_app(CLI::App& app, TrainOptions& out) {
    app.get_formatter()->column_width(34);
    app.option_defaults()->always_capture_default();  // --help shows each option's default
    // a flag given twice takes the last value (so wrappers can append overrides)
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    add_flags(app, out);
}

const char* const kAppDescription =
    "qtrain: train Qwen2.5-family LLMs in C++/CUDA.\n"
    "Example: train --model=Qwen2.5-0.5B --from-scratch --train-file='data/*/train.bin' "
    "--eval-file=data/x/eval.bin --steps=1000 --learning-rate=6e-4";

// CLI11 reads "--flag=" as the flag without a value and then takes the next argument as its value
// ("--checkpoint-dir= --out-dir=mine" would put the checkpoints in "--out-dir=mine"), so an empty
// value is refused, naming the flag: the message, or "" when every argument has a value.
std::string empty_value_error(const std::vector<std::string>& args) {
    for (const std::string& arg : args) {
        if (arg == "--") break;
        if (arg.size() > 3 && arg.rfind("--", 0) == 0 && arg.back() == '=' && arg.find('=') == arg.size() - 1)
            return cat(arg.substr(0, arg.size() - 1), " has an empty value (give ", arg,
                       "<value>, or leave the flag out for its default)");
    }
    return {};
}

}  // namespace

std::optional<int> parse_train_options(int argc, const char* const* argv, TrainOptions& out) {
    CLI::App app{kAppDescription, "train"};
    configure_app(app, out);
    if (const std::string e = empty_value_error(std::vector<std::string>(argv + std::min(argc, 1), argv + argc));
        !e.empty()) {
        std::fprintf(stderr, "error: %s\n", e.c_str());
        return 1;
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    return std::nullopt;
}

TrainOptions train_options_from_args(const std::vector<std::string>& args) {
    TrainOptions out;
    CLI::App app{kAppDescription, "train"};
    configure_app(app, out);
    if (const std::string e = empty_value_error(args); !e.empty()) throw_error(e);
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
    try {
        app.parse(reversed);
    } catch (const CLI::CallForHelp&) {
        throw_error(app.help());
    } catch (const CLI::ParseError& e) {
        throw_error(e.what());
    }
    return out;
}

}  // namespace qtrain
