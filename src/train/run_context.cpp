#include "train/run_context.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "train/output_tokenizer.h"
#include "train/packing_options.h"
#include "train/rank_devices.h"
#include "train/rendezvous_bound.h"
#include "train/run_guard.h"

namespace qtrain {

namespace fs = std::filesystem;

RunContext make_run_context(const TrainOptions& options, const std::string& command_line, comm::Communicator* host,
                            const ProcessLaunch* launch, const ModelCommunicatorFactory& model_communicator,
                            bool need_train_file) {
    RunContext ctx;
    ctx.t_start = std::chrono::steady_clock::now();
    ctx.command_line = command_line;
    TrainOptions& o = ctx.options;
    o = options;
    o.validate(need_train_file);
    // the number of ranks: --gpus threads, or mpirun's processes (then --gpus says nothing new)
    int world = std::max(1, o.gpus);
    if (host) {
        world = host->world();
        const bool mpirun = launch->mode == "MPI mode";
        QT_CHECK(o.gpus == 1 || o.gpus == world, "--gpus=", o.gpus, " but ", mpirun ? "mpirun" : launch->mode, " started ",
                 world, " processes (", mpirun ? cat("-np ", world) : launch->ranks_source, "): each process is one rank; "
                 "give --gpus=", world, " or leave --gpus out");
        o.gpus = world;  // recorded resolved, so a checkpoint's options say how many ranks wrote it
        ctx.launch = launch->mode;
        ctx.ranks_source = launch->ranks_source;
        ctx.mpi_local_rank = launch->local_rank;
    } else {
        ctx.launch = "threads mode";
        ctx.ranks_source = cat("--gpus=", o.gpus);
    }
    ctx.world = world;
    if (!o.gpu_ids.empty()) {
        ctx.gpu_ids = parse_gpu_ids(o.gpu_ids);
        check_gpu_ids_count(ctx.gpu_ids, world, ctx.ranks_source);
    }

    std::string& device = ctx.device;
    device = resolve_device(o.device, !o.plan_only);
    // a plan is made for the machine that will train, so on a machine without a GPU --plan-only
    // still plans for the GPU unless told --device=cpu
    const bool planning_for_gpu = o.plan_only && o.device == "auto" && device == "cpu" && cuda_backend_built();
    if (planning_for_gpu) device = "cuda";
    QT_CHECK(o.gpu_ids.empty() || device != "cpu", "--gpu-ids is not supported on --device=cpu (it places ranks on "
             "CUDA devices; the CPU ranks are threads or processes of this machine): leave it out");
    // --zero-level=2|3 reach the model as the sharding they imply (model_options.h), which the CPU model
    // refuses on one rank under the implied flag's name, so the level the user gave is named here
    QT_CHECK(device != "cpu" || world > 1 || o.zero_level <= 1, "--zero-level=", o.zero_level,
             " on --device=cpu needs several ranks (--gpus > 1 or mpirun): one rank has nothing to shard; leave it out "
             "or give --zero-level=1");
    ctx.source = resolve_model_source(o);
    const ModelConfig& cfg = ctx.source.config;
    QT_CHECK(o.seq_len <= cfg.max_position_embeddings, "--seq-len=", o.seq_len,
             " is longer than the model's max_position_embeddings (", cfg.max_position_embeddings, ", ",
             ctx.source.description, "): positions beyond it were never trained; use --seq-len<=",
             cfg.max_position_embeddings, " (or raise max_position_embeddings in the model's config.json if you mean to "
             "extend the context)");
    // loaded now (a second or so for Qwen's 7 MB tokenizer.json), though only written at the end, by rank 0
    const bool lead = !host || host->rank() == 0;
    if (!o.plan_only && lead)
        if (std::optional<Tokenizer> t = load_output_tokenizer(o.tokenizer, cfg.vocab_size))
            ctx.tokenizer = std::make_shared<const Tokenizer>(std::move(*t));
    ctx.model_options = o.model_options(device);
    // Packing is decided once, here: --document-masking=auto by the train files' headers, so the plan
    // (the positions buffer, the attention kernels), the ranks' loaders and their models see one decision.
    try {
        ctx.packing = decide_packing(o, o.train_file.empty() ? std::vector<std::string>()
                                                            : expand_glob(o.train_file, "--train-file"));
    } catch (const Error&) {
        // a missing or bad --train-file: the loader names it when the run opens the files
        ctx.packing = decide_packing(o, {});
    }
    ctx.model_options.document_masking = ctx.packing.document_masking;
    if (planning_for_gpu)
        std::printf("note: no GPU here; --plan-only plans for the GPU (--device=cuda). --device=cpu plans the CPU "
                    "reference model instead\n\n");
    ctx.plan = check_memory_plan(o, cfg, ctx.model_options, device, world);
    if (o.plan_only) return ctx;

    // Everything this run will write is checked before the model takes memory and time.
    probe_writable_dir(o.out_dir, "--out-dir");
    probe_writable_dir(fs::path(o.log_path()).parent_path().string(), "--log-file");
    probe_writable_dir(o.checkpoint_dir, "--checkpoint-dir");

    if (model_communicator) {
        ctx.model_communicator = model_communicator;
    } else {
        std::vector<int> devices;  // each rank's GPU (threads mode: all in this process)
        for (int r = 0; r < world; ++r) devices.push_back(rank_device_index(ctx.gpu_ids, r, ctx.mpi_local_rank));
        ctx.model_communicator =
            model_communicator_factory(device, ctx.model_options, world, devices, host, rendezvous_bound(o));
    }
    ctx.test_fault = read_test_fault();
    return ctx;
}

}  // namespace qtrain
