// Every flag of the `train` program in one struct. The CLI (CLI11) and the Python bindings fill the
// same struct; `to_json` records it in the log and in checkpoints. Each field's flag (name, help,
// check, resume rule, the model's fields it fills and the flags it implies) is an entry of the option
// table (option_table.h), which registers, writes and reads them and makes the model's options; a new
// field needs its entry there.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model_options.h"

namespace qtrain {

struct TrainOptions {
    // model
    std::string model;              // HF directory, org/name in the local HF cache, or a preset name
    std::string tokenizer;          // as `tokenize --tokenizer`; its HF files go to out_dir ("" = --model's, if any)
    bool from_scratch = false;
    std::string device = "auto";    // auto | cpu | cuda
    // data
    std::string train_file;         // glob
    std::string eval_file;          // glob (optional)
    int batch_size = 4;
    int seq_len = 1024;
    std::string document_masking = "auto";    // auto | on | off (train/packing_options.h)
    std::string loss_normalization = "auto";  // auto | tokens | micro-batch
    std::string packing = "greedy";           // greedy | one-per-row (with document masking)
    // precision ("" = the device's default: fp32 on cpu, bf16 on cuda)
    std::string model_dtype;
    std::string matmul_dtype;       // "" = model dtype
    std::string gradient_dtype;     // "" = matmul dtype (bf16 when matmuls are fp8)
    std::string lm_head_dtype = "bf16";  // bf16 | e4m3 (ModelOptions::fp8_lm_head)
    std::string opt_m_dtype = "fp32";
    std::string opt_v_dtype = "fp32";
    std::string master_dtype = "fp32";
    std::string param_grad_dtype = "fp32";
    // recompute
    bool recompute_swiglu = false, recompute_norm = false, recompute_qkv = false;
    bool recompute_ffn = false, recompute_att = false, recompute_block = false;
    // offload
    bool offload_residual = false, offload_master = false, offload_opt_m = false, offload_opt_v = false;
    bool offload_quants = false, offload_gradients = false, offload_double_buffer = false;
    bool persistent_quants = false, write_combined = false, memcpy_all_gather = false;
    // multi-GPU / sharding
    int gpus = 1;
    double comm_timeout = 600;      // --comm-timeout seconds (0: off), progress_watchdog.h
    double rendezvous_timeout = 600; // --rendezvous-timeout seconds (0: none), train/rendezvous_bound.h
    std::string gpu_ids;            // "0,1,...": the CUDA device of each rank; "" = rank_devices.h's default
    bool shard_weights = false, shard_gradients = false;
    int zero_level = 1;
    // performance
    bool use_cuda_graphs = false;
    int lmhead_chunks = 1;
    int attn_bwd_chunks = 1;
    std::string attention = "auto";
    std::string fp8_weight_transposes = "kept";  // kept | jit (ModelOptions::fp8_transposes_jit)
    int max_docs_per_row = 32;      // --attention=cudnn with --document-masking (cuda/attention_ragged.h)
    std::string fp8_fast_accum = "off";
    bool gemm_autotune = false;
    std::string memory_limit;       // e.g. 24GiB; "" = no limit beyond the device
    std::string host_memory_limit;  // pinned host memory cap; "" = this machine's RAM (training runs only)
    bool plan_only = false;
    // optimisation
    int steps = 1000;
    int grad_accumulation = 4;
    float learning_rate = 1e-5f;
    std::string lr_schedule = "cosine";
    int warmup = -1;                // -1 = min(100, steps / 10)
    int cooldown = 0;
    float final_lr_fraction = 1.0f;
    float weight_decay = 0.1f;
    float grad_clip = 1.0f;
    float beta_1 = 0.9f;
    float beta_2 = 0.95f;
    float adam_epsilon = 1e-8f;
    // evaluation, checkpoints, output
    int eval_every_n_steps = 100;
    int eval_num_steps = 100;       // 0 = the whole eval set
    int ckpt_interval = 0;          // 0 = no periodic checkpoints
    int ckpt_keep = 0;              // keep only the newest N complete checkpoints; 0 = all
    std::string out_dir = "output";
    std::string export_checkpoint;  // --export-checkpoint: write this checkpoint's HF model and exit
    std::string checkpoint_dir = "ckpt";
    std::string log_file;           // "" = <out-dir>/log.jsonl
    bool continue_from_checkpoint = false;
    bool overwrite = false;         // replace another run's output/checkpoints instead of refusing
    bool force_resume = false;      // --continue even when options that change the run differ
    uint64_t seed = 42;
    // LoRA (issue 33; model/lora.h): adapters on a frozen base, --device=cpu only for now
    int lora_rank = 0;                   // 0 = off (full training)
    float lora_alpha = 8.0f;             // PEFT's default lora_alpha; scaling alpha / rank
    float lora_dropout = 0.0f;           // in [0, 1), training passes only
    std::string lora_targets = "all";    // all | any of q,k,v,o,gate,up,down
    std::string lora_init = "kaiming";   // kaiming (PEFT's default) | gaussian
    std::string lora_from;               // a PEFT adapter directory to start from ("" = fresh adapters)
    bool merge_lora = false;             // export the merged model instead of the adapter
    std::string train_also;              // "" | norms,embeddings: base tensors also trained in full

    // Resolved helpers
    int warmup_steps() const { return warmup >= 0 ? warmup : std::min(100, steps / 10); }
    std::string log_path() const { return log_file.empty() ? out_dir + "/log.jsonl" : log_file; }
    // Throws a clear error for values out of range (names the flag). need_train_file=false: the
    // Python session may feed its own tokens instead of --train-file's.
    void validate(bool need_train_file = true) const;
    // The --lora-* flags alone (validate calls it): unknown targets, settings without --lora-rank.
    void validate_lora() const;
    // The model-layer view, for `device` ("cpu" or "cuda"), with dtype defaults resolved: every
    // implication of the option table applied, then each entry's `to_model`.
    ModelOptions model_options(const std::string& resolved_device) const;
    std::string to_json() const;  // one JSON object, flag names as keys (options_json.cpp)
    // The options a to_json recorded: missing keys keep their defaults, unknown keys are ignored, a
    // value of the wrong JSON type is a qtrain::Error naming the key.
    static TrainOptions from_json(const std::string& json);
};

// Parses argv (CLI11) into `out`. Returns std::nullopt to go on, or the exit code when the program
// should stop (after --help, or a parse error that was already printed).
std::optional<int> parse_train_options(int argc, const char* const* argv, TrainOptions& out);
// The same flags from `args` (without the program name), for embedding qtrain (the Python package):
// throws qtrain::Error with the message the command line would print (--help: the help text).
TrainOptions train_options_from_args(const std::vector<std::string>& args);

}  // namespace qtrain
