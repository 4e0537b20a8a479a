#include "train/memory_fit.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <initializer_list>
#include <stdexcept>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/error.h"
#include "backends/model_backends.h"
#include "train/model_source.h"
#include "train/option_table.h"

namespace qtrain {

namespace {

// A flag as a suggestion gives it: a field of TrainOptions (its entry of the option table has the
// name) and its value: "" for a boolean flag turned on, "off" for one turned off ("without --x").
struct Setting {
    OptionMember flag;
    std::string value;
};

Setting on(bool TrainOptions::* flag) { return {flag, ""}; }
Setting off(bool TrainOptions::* flag) { return {flag, "off"}; }
template <class V>
Setting set(V TrainOptions::* flag, const std::string& value) {
    return {flag, value};
}

std::string describe(const std::vector<Setting>& settings) {
    std::string out;
    for (const Setting& s : settings) {
        const std::string flag = flag_name(train_option_of(s.flag));
        if (!out.empty()) out += " ";
        out += s.value.empty() ? flag : s.value == "off" ? "without " + flag : flag + "=" + s.value;
    }
    return out;
}

// `o` with the settings given, as the model sees it (so with what each flag implies).
ModelOptions with(TrainOptions o, const std::vector<Setting>& settings, const std::string& device) {
    for (const Setting& s : settings)
        std::visit(
            [&](auto member) {
                auto& field = o.*member;
                using F = std::decay_t<decltype(field)>;
                if constexpr (std::is_same_v<F, bool>) field = s.value != "off";
                else if constexpr (std::is_same_v<F, std::string>) field = s.value;
                else if constexpr (std::is_same_v<F, int>) field = std::stoi(s.value);
                else throw std::logic_error("memory_fit: a suggested flag of a type it does not set");
            },
            s.flag);
    return o.model_options(device);
}

}  // namespace

// The first of a ladder of memory-saving flag sets (each saving more than the one before, at more
// recomputation) with which the plan fits `limit`; empty when none does or the backend refuses them.
std::string flags_that_fit(const ModelConfig& cfg, const TrainOptions& o, const std::string& device, uint64_t limit) {
    using T = TrainOptions;
    const Setting block = on(&T::recompute_block), opt_m = on(&T::offload_opt_m), opt_v = on(&T::offload_opt_v),
                  master = on(&T::offload_master), gradients = on(&T::offload_gradients);
    // recomputation first (cheapest in memory traffic), the same on one GPU and on several
    std::vector<std::vector<Setting>> ladder = {
        {on(&T::recompute_swiglu)},
        {on(&T::recompute_ffn)},
        {on(&T::recompute_ffn), on(&T::recompute_norm)},
        {on(&T::recompute_ffn), on(&T::recompute_norm), on(&T::recompute_att)},
        {block},
    };
    if (o.gpus > 1) {
        // Data parallel: sharding over the ranks (ZeRO-2, then ZeRO-3) costs communication but no PCIe
        // traffic, so it comes before offloading; with --offload-master ZeRO-3 streams the rank's block
        // of the weights from host memory. LoRA on the GPU takes {block, zero2} and {block, zero3}
        // (ZeRO-3 shards its frozen base: the rung that saves most for it) and refuses the offloads after them.
        const Setting zero2 = set(&T::zero_level, "2"), zero3 = set(&T::zero_level, "3");
        ladder.insert(ladder.end(), {{block, zero2},
                                     {block, zero3},
                                     {block, zero3, opt_m, opt_v},
                                     {block, zero3, opt_m, opt_v, master},
                                     {block, zero3, opt_m, opt_v, master, gradients}});
    } else {
        // then, on one GPU, host memory
        ladder.insert(ladder.end(), {{block, opt_m, opt_v},
                                     {block, opt_m, opt_v, master},
                                     {block, opt_m, opt_v, master, gradients},
                                     {block, opt_m, opt_v, master, gradients, on(&T::shard_weights)}});
        // LoRA refuses the offloads above (its base has no optimizer state); on the FP8 base with FP8
        // gradients it streams the base's codes from host memory instead (gpu_buffers.h, fp8_base_streamed)
        if (o.lora_rank > 0) ladder.push_back({block, on(&T::shard_weights)});
    }
    // FP8 gradients on the full GPU model: --fp8-weight-transposes=jit first, and on every rung after it.
    // It is bit-identical and costs ~0.5% of the step (one transpose of each matrix per backward) for a
    // byte per parameter, so it comes before any recomputation. (LoRA's FP8 base does it anyway.)
    const ModelOptions given = o.model_options(device);
    if (device == "cuda" && fp8_weight_transposes_apply(given) && !given.fp8_transposes_jit) {
        const Setting jit = set(&T::fp8_weight_transposes, "jit");
        for (std::vector<Setting>& rung : ladder) rung.insert(rung.begin(), jit);
        ladder.insert(ladder.begin(), {jit});
    }
    // each rung first as it is, then with the LM head in 8 chunks (cheap: it only bounds the logits)
    auto fits = [&](const std::vector<Setting>& settings) {
        try {
            return plan_model(cfg, with(o, settings, device), device).total_device() <= limit;
        } catch (const Error&) {
            return false;  // this backend does not take these flags
        }
    };
    const int more_chunks = std::max(o.lmhead_chunks, 8);
    const Setting chunks = set(&T::lmhead_chunks, std::to_string(more_chunks));
    // Last on each rung, on the GPU: qtrain's flash kernels instead of cuDNN's attention, whose
    // deterministic backward keeps a dP workspace of B·Hq·T²·2 bytes (60 GB for 7B at seq 32768). Flash
    // needs none but runs attention slower, so it comes after the cheaper savings of the same rung.
    const bool try_flash = device == "cuda" && o.attention != "flash";
    const Setting flash = set(&T::attention, "flash");
    if (more_chunks != o.lmhead_chunks && fits({chunks})) return describe({chunks});
    for (std::vector<Setting>& rung : ladder) {
        if (fits(rung)) return describe(rung);
        if (more_chunks != o.lmhead_chunks) {
            rung.push_back(chunks);
            if (fits(rung)) return describe(rung);
        }
        if (try_flash) {
            rung.push_back(flash);
            if (fits(rung)) return describe(rung);
        }
    }
    return {};
}

// The largest --batch-size (at most `cap`) whose plan fits `limit` (and `host_limit` when set) with
// these flags, or 0. The streamed configurations pay their PCIe traffic per micro-batch, so the
// largest micro-batch that fits is usually the fastest: --plan-only says what it is. Sizes are
// multiples of --attn-bwd-chunks (which must divide the batch); a plan grows with the batch, so a
// binary search over those finds it.
int largest_batch_that_fits(const ModelConfig& cfg, ModelOptions m, const std::string& device, uint64_t limit,
                            uint64_t host_limit, int cap) {
    const int step = std::max(1, m.attn_bwd_chunks);
    auto fits = [&](int k) {
        m.batch_size = k * step;
        try {
            const MemoryPlan p = plan_model(cfg, m, device);
            return p.total_device() <= limit && (!host_limit || p.total_pinned() <= host_limit);
        } catch (const Error&) {
            return false;
        }
    };
    int lo = 0, hi = cap / step;  // fits(lo) holds (0: nothing), the answer is in [lo, hi]
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (fits(mid)) lo = mid;
        else hi = mid - 1;
    }
    return lo * step;
}

// The first of a ladder of host-memory-saving precision flags (cumulative) with which the pinned
// plan fits `host_limit` (and the device plan still fits `limit`); empty when none does. Rungs that
// change nothing for these options (say, moments already bf16) are skipped.
std::string pinned_flags_that_fit(const ModelConfig& cfg, const TrainOptions& o, const std::string& device,
                                  uint64_t limit, uint64_t host_limit) {
    using T = TrainOptions;
    std::vector<Setting> settings;
    ModelOptions t = o.model_options(device);  // the options so far
    // adds `rung` when it `applies` to the options so far; whether all so far make the plan fit
    auto fits_with = [&](bool applies, std::initializer_list<Setting> rung) {
        if (!applies) return false;
        settings.insert(settings.end(), rung);
        try {
            t = with(o, settings, device);
            const MemoryPlan p = plan_model(cfg, t, device);
            return p.total_pinned() <= host_limit && (!limit || p.total_device() <= limit);
        } catch (const Error&) {
            return false;
        }
    };
    if (fits_with(t.offload_gradients && t.param_grad_dtype == DType::F32, {set(&T::param_grad_dtype, "bf16")}) ||
        fits_with((t.offload_opt_m && t.opt_m_dtype == DType::F32) || (t.offload_opt_v && t.opt_v_dtype == DType::F32),
                  {set(&T::opt_m_dtype, "bf16"), set(&T::opt_v_dtype, "bf16")}) ||
        fits_with(t.offload_master && t.master_dtype == DType::F32 && t.model_dtype == DType::BF16,
                  {set(&T::master_dtype, "bf16"), off(&T::offload_master)}))
        return describe(settings);
    return {};
}

// What a training run may pin: this machine's RAM — or its container's memory limit (cgroup v2 or
// v1) when lower — less 5% (at least 4 GiB) for everything else.
uint64_t usable_host_memory() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return 0;  // unknown: no check
    uint64_t ram = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
    for (const char* limit_file : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
        std::ifstream in(limit_file);
        uint64_t limit = 0;
        if (in >> limit && limit > 0) ram = std::min(ram, limit);  // "max" (no limit) does not parse
    }
    const uint64_t keep = std::max<uint64_t>(4ull << 30, ram / 20);
    return ram > keep ? ram - keep : 0;
}

}  // namespace qtrain
