#include "train/memory_fit.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.h"
#include "backends/model_backends.h"
#include "train/model_source.h"

namespace qtrain {

// The first of a ladder of memory-saving flag sets (each saving more than the one before, at more
// recomputation) with which the plan fits `limit`; empty when none does or the backend refuses them.
std::string flags_that_fit(const ModelConfig& cfg, ModelOptions m, const std::string& device, uint64_t limit) {
    struct Step {
        const char* flags;
        void (*apply)(ModelOptions&);
    };
    // recomputation first (cheapest in memory traffic), the same on one GPU and on several
    static const Step recompute[] = {
        {"--recompute-swiglu", [](ModelOptions& o) { o.recompute_swiglu = true; }},
        {"--recompute-ffn", [](ModelOptions& o) { o.recompute_ffn = o.recompute_swiglu = true; }},
        {"--recompute-ffn --recompute-norm", [](ModelOptions& o) { o.recompute_norm = true; }},
        {"--recompute-ffn --recompute-norm --recompute-att",
         [](ModelOptions& o) { o.recompute_att = o.recompute_qkv = true; }},
        {"--recompute-block", [](ModelOptions& o) { o.recompute_block = true; }},
    };
    // then, on one GPU, host memory
    static const Step one_gpu[] = {
        {"--recompute-block --offload-opt-m --offload-opt-v",
         [](ModelOptions& o) { o.offload_opt_m = o.offload_opt_v = true; }},
        {"--recompute-block --offload-opt-m --offload-opt-v --offload-master",
         [](ModelOptions& o) { o.offload_master = true; }},
        {"--recompute-block --offload-opt-m --offload-opt-v --offload-master --offload-gradients",
         [](ModelOptions& o) { o.offload_gradients = true; }},
        {"--recompute-block --offload-opt-m --offload-opt-v --offload-master --offload-gradients --shard-weights",
         [](ModelOptions& o) { o.shard_weights = true; }},
    };
    // Data parallel: sharding over the ranks (ZeRO-2, then ZeRO-3) costs communication but no PCIe
    // traffic, so it comes before offloading; with --offload-master ZeRO-3 streams the rank's block
    // of the weights from host memory.
    static const Step ranks[] = {
        {"--recompute-block --zero-level=2", [](ModelOptions& o) { o.shard_gradients = true, o.zero_level = 2; }},
        {"--recompute-block --zero-level=3", [](ModelOptions& o) { o.shard_weights = true, o.zero_level = 3; }},
        {"--recompute-block --zero-level=3 --offload-opt-m --offload-opt-v",
         [](ModelOptions& o) { o.offload_opt_m = o.offload_opt_v = true; }},
        {"--recompute-block --zero-level=3 --offload-opt-m --offload-opt-v --offload-master",
         [](ModelOptions& o) { o.offload_master = true; }},
        {"--recompute-block --zero-level=3 --offload-opt-m --offload-opt-v --offload-master --offload-gradients",
         [](ModelOptions& o) { o.offload_gradients = true; }},
    };
    std::vector<Step> ladder(std::begin(recompute), std::end(recompute));
    if (m.gpus > 1) ladder.insert(ladder.end(), std::begin(ranks), std::end(ranks));
    else ladder.insert(ladder.end(), std::begin(one_gpu), std::end(one_gpu));
    // each rung first as it is, then with the LM head in 8 chunks (cheap: it only bounds the logits)
    auto fits = [&](const ModelOptions& t) {
        try {
            return plan_model(cfg, t, device).total_device() <= limit;
        } catch (const Error&) {
            return false;  // this backend does not take these flags
        }
    };
    const int more_chunks = std::max(m.lmhead_chunks, 8);
    const std::string chunk_flag = cat("--lmhead-chunks=", more_chunks);
    ModelOptions t = m;
    if (more_chunks != m.lmhead_chunks) {
        t.lmhead_chunks = more_chunks;
        if (fits(t)) return chunk_flag;
        t.lmhead_chunks = m.lmhead_chunks;
    }
    for (const Step& s : ladder) {
        s.apply(t);
        if (fits(t)) return s.flags;
        if (more_chunks != m.lmhead_chunks) {
            ModelOptions c = t;
            c.lmhead_chunks = more_chunks;
            if (fits(c)) return cat(s.flags, " ", chunk_flag);
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
std::string pinned_flags_that_fit(const ModelConfig& cfg, ModelOptions t, const std::string& device, uint64_t limit,
                                  uint64_t host_limit) {
    auto fits = [&](const ModelOptions& o) {
        try {
            const MemoryPlan p = plan_model(cfg, o, device);
            return p.total_pinned() <= host_limit && (!limit || p.total_device() <= limit);
        } catch (const Error&) {
            return false;
        }
    };
    std::string flags;
    auto rung = [&](bool applies, const char* f, auto apply) {
        if (!applies) return false;
        apply(t);
        flags += flags.empty() ? f : cat(" ", f);
        return fits(t);
    };
    if (rung(t.offload_gradients && t.param_grad_dtype == DType::F32, "--param-grad-dtype=bf16",
             [](ModelOptions& o) { o.param_grad_dtype = DType::BF16; }))
        return flags;
    if (rung((t.offload_opt_m && t.opt_m_dtype == DType::F32) || (t.offload_opt_v && t.opt_v_dtype == DType::F32),
             "--opt-m-dtype=bf16 --opt-v-dtype=bf16", [](ModelOptions& o) { o.opt_m_dtype = o.opt_v_dtype = DType::BF16; }))
        return flags;
    if (rung(t.offload_master && t.master_dtype == DType::F32 && t.model_dtype == DType::BF16,
             "--master-dtype=bf16 without --offload-master", [](ModelOptions& o) {
                 o.master_dtype = DType::BF16;
                 o.offload_master = false;
             }))
        return flags;
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
