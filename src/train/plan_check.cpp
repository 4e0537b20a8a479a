#include "train/plan_check.h"

#include <algorithm>

#include "core/error.h"
#include "core/files.h"
#include "train/logger.h"
#include "train/memory_fit.h"
#include "backends/model_backends.h"
#include "train/model_source.h"
#include "train/train_options.h"

namespace qtrain {

CheckedPlan check_memory_plan(const TrainOptions& o, const ModelConfig& cfg, const ModelOptions& mopt,
                              const std::string& device, int ranks) {
    CheckedPlan c;
    // The CPU model's plan is host memory: a training run checks it against this machine's RAM (a
    // batch that does not fit would be killed by the OOM killer minutes later), like the pinned plan;
    // with several CPU ranks each gets its share of it.
    const uint64_t ram_limit = device == "cpu" && !o.plan_only ? usable_host_memory() / ranks : 0;
    c.limit = ram_limit && (!mopt.memory_limit || ram_limit < mopt.memory_limit) ? ram_limit : mopt.memory_limit;
    const std::string limit_name =
        c.limit && c.limit == ram_limit
            ? (ranks > 1 ? cat("this machine can give each of the ", ranks, " CPU ranks about ")
                         : std::string("this machine can give the CPU model about "))
            : std::string("--memory-limit is ");

    c.plan = plan_model(cfg, mopt, device);
    if (c.limit && c.plan.total_device() > c.limit) {
        Logger("/dev/null", true).log_memory(c.plan, c.limit);  // show where the memory goes, then fail
        const std::string fit = flags_that_fit(cfg, o, device, c.limit);
        const int fitting_batch = largest_batch_that_fits(cfg, mopt, device, c.limit, 0, mopt.batch_size);
        const std::string smaller = fitting_batch > 0
                                        ? cat("with the current flags --batch-size=", fitting_batch, " fits")
                                        : std::string("with the current flags not even --batch-size=1 fits");
        throw_error(cat("the memory plan needs ", human_bytes(c.plan.total_device()), " but ", limit_name,
                        human_bytes(c.limit), "; ",
                        fit.empty() ? cat("no recompute, offload or streaming setting makes it fit: reduce --batch-size "
                                          "or --seq-len (", smaller, ")")
                                    : cat("it fits with ", fit, " (or reduce --batch-size or --seq-len; ", smaller, ")")));
    }
    // Pinned memory cannot be swapped: a plan larger than the host fails here, not minutes later in
    // cudaHostAlloc or the OOM killer.
    c.explicit_host = !o.host_memory_limit.empty();
    c.host_limit = c.explicit_host ? parse_bytes(o.host_memory_limit, "--host-memory-limit")
                   : o.plan_only   ? 0
                                   : usable_host_memory();
    if (c.host_limit && c.plan.total_pinned() > c.host_limit) {
        Logger("/dev/null", true).log_memory(c.plan, c.limit);
        const std::string fit = pinned_flags_that_fit(cfg, o, device, c.limit, c.host_limit);
        throw_error(cat("the memory plan pins ", human_bytes(c.plan.total_pinned()), " of host memory but ",
                        c.explicit_host ? "--host-memory-limit is " : "this machine can pin about ",
                        human_bytes(c.host_limit), "; ",
                        fit.empty() ? std::string("no bf16 precision flag makes it fit: offload less, or use a machine "
                                                  "with more memory (or more GPUs, which shard it)")
                                    : cat("it fits with ", fit)));
    }
    return c;
}

void print_plan_only(const CheckedPlan& c, const ModelConfig& cfg, const ModelOptions& mopt, const std::string& device) {
    Logger plan_logger("/dev/null", true);
    plan_logger.log_memory(c.plan, c.limit);
    if (const ZeroLevel zero = zero_level(mopt); mopt.gpus > 1)
        plan_logger.message(cat(
            "note: the plan of each of the ", mopt.gpus, " ranks (", device == "cpu" ? "CPU ranks" : "one GPU each",
            device == "cpu" ? std::string("; the CPU model keeps its whole state on every rank)")
            : mopt.lora.enabled() && zero == ZeroLevel::Weights
                ? cat("; LoRA at ZeRO-3: the frozen base is one rank's block, 1/", mopt.gpus, " of it (",
                      is_fp8(mopt.matmul_dtype) && is_fp8(mopt.gradient_dtype)  // (the FP8 base: fp8_base_only)
                          ? "the FP8 base's e4m3 codes of the layers; its norms, biases, embedding and "
                                "head whole on every rank"
                          : "its model-dtype weights, beside the whole non-layer weights",
                      "), and two layer slots the layers are gathered into; the adapters' model-dtype weights and "
                      "gradient are whole, their fp32 master and Adam's moments one rank's block (ZeRO-2 of the "
                      "adapters))")
            : mopt.lora.enabled()
                ? cat("; LoRA: the frozen base, the adapters' model-dtype weights and their gradient are whole on "
                      "every rank, the adapters' fp32 master and Adam's moments one rank's block, 1/", mopt.gpus,
                      " of them (ZeRO-1/2 of the adapters))")
            : zero == ZeroLevel::Weights
                ? cat("; ZeRO-3: the master weights, Adam's moments, the gradients and the weights are one rank's "
                      "block, 1/", mopt.gpus, " of them, beside the whole non-layer weights and two layer slots the "
                      "layers are gathered into)")
                : cat("; ZeRO-", static_cast<int>(zero), ": the master weights and Adam's moments",
                      zero == ZeroLevel::Gradients ? " and the gradients" : "", " are one rank's block, 1/", mopt.gpus,
                      " of them; the weights", zero == ZeroLevel::Gradients ? "" : " and gradients",
                      " are whole on every rank)")));
    // a plan may be made for another machine, so only a note: a training run here would fail
    if (const uint64_t here = usable_host_memory(); !c.explicit_host && here && c.plan.total_pinned() > here)
        plan_logger.message(cat("note: the plan pins ", human_bytes(c.plan.total_pinned()),
                                " of host memory; this machine can pin about ", human_bytes(here),
                                ", so training here would fail before allocating (--host-memory-limit checks "
                                "a plan against another machine's memory)"));
    if (!c.limit) return;
    // how far the micro-batch could grow under the limit with these flags
    constexpr int kCap = 4096;
    auto largest_with = [&](const ModelOptions& o) {
        return largest_batch_that_fits(cfg, o, device, c.limit, c.explicit_host ? c.host_limit : 0,
                                       std::max(kCap, mopt.batch_size));
    };
    auto up_to = [&](int b) { return cat("--batch-size up to ", b, b >= kCap ? " (or more)" : ""); };
    const int largest = largest_with(mopt);
    plan_logger.message(cat("note: with these flags ", up_to(largest), " fits --memory-limit=", human_bytes(c.limit),
                            c.explicit_host ? " and --host-memory-limit" : "",
                            " (the plan leaves out the CUDA context and libraries: ~0.7 GiB more on an H200); "
                            "streamed runs (--shard-weights, --offload-gradients) move their weights and "
                            "gradients over PCIe once per micro-batch, so a larger one is usually faster"));
    // Streamed runs' largest remaining activation is the residual stream kept per layer; moving
    // it to pinned memory costs little there (7B under 24 GiB: 25 -> 38 sequences, 8.5k -> 10.1k
    // tokens/s, docs/benchmarks.md), so say what it would allow.
    if (mopt.shard_weights && !mopt.offload_residual) {
        ModelOptions r = mopt;
        r.offload_residual = true;
        if (const int with_res = largest_with(r); with_res > largest) {
            r.batch_size = with_res;
            plan_logger.message(cat("note: with --offload-residual as well, ", up_to(with_res), " fits (pinning ",
                                    human_bytes(plan_model(cfg, r, device).total_pinned()),
                                    " at that size); the residual copies overlap the streamed step"));
        }
    }
}

}  // namespace qtrain
