#include "train/resume_check.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/option_table.h"
#include "train/train_options.h"

namespace qtrain {

using json = nlohmann::json;

namespace {

std::string show(const json& v) {
    if (v.is_string()) return v.get<std::string>().empty() ? "(default)" : v.get<std::string>();
    if (v.is_number_float()) return cat(static_cast<float>(v.get<double>()));  // the flags are floats: 1e-05
    return v.dump();
}

// The options whose recorded "" or -1 stands for a default that depends on the device or on --steps
// (ResumeRule::Resolved), compared as the values they resolve to.
void compare_resolved(const json& old_j, const TrainOptions& old, const std::string& old_device,
                      const TrainOptions& now, const std::string& device, std::vector<OptionChange>& out) {
    if (old_j.contains("warmup") && old.warmup_steps() != now.warmup_steps()) {
        auto how = [](const TrainOptions& o) {
            return o.warmup >= 0 ? std::to_string(o.warmup)
                                 : cat(o.warmup_steps(), " (the default, min(100, --steps/10))");
        };
        out.push_back({"--warmup", how(old), how(now), true,
                       cat("the warmup decides the learning rate of every step; pass --warmup=", old.warmup_steps(),
                           " to keep the checkpoint's")});
    }
    ModelOptions a, b;
    try {
        a = old.model_options(old_device);
        b = now.model_options(device);
    } catch (const Error&) {
        return;  // a value this version does not know: the plain comparison below reports it
    }
    const std::pair<const char*, std::pair<DType, DType>> roles[] = {
        {"--model-dtype", {a.model_dtype, b.model_dtype}},
        {"--matmul-dtype", {a.matmul_dtype, b.matmul_dtype}},
        {"--gradient-dtype", {a.gradient_dtype, b.gradient_dtype}}};
    for (const auto& [flag, types] : roles)
        if (types.first != types.second)
            out.push_back({flag, std::string(dtype_name(types.first)), std::string(dtype_name(types.second)), true,
                           old_device != device ? cat("the default depends on --device (", old_device, " then, ",
                                                      device, " now): give ", flag, "=", dtype_name(types.first))
                                                : std::string()});
}

}  // namespace

std::vector<OptionChange> compare_resume_options(const std::string& recorded_options_json,
                                                 const std::string& recorded_device,
                                                 const std::string& recorded_config_json, const TrainOptions& now,
                                                 const std::string& device, const ModelConfig& config) {
    // the recorded options as values (a key this version does not know is skipped; a wrong type is an error)
    const TrainOptions old = TrainOptions::from_json(recorded_options_json);
    const json old_j = json::parse(recorded_options_json), now_j = json::parse(now.to_json());
    std::vector<OptionChange> changes;

    // the model: its shape and math (config.json as qtrain writes it), not the path it came from
    const json old_cfg = json::parse(recorded_config_json), now_cfg = json::parse(model_config_to_json(config));
    for (auto it = now_cfg.begin(); it != now_cfg.end(); ++it) {
        const json& before = old_cfg.contains(it.key()) ? old_cfg[it.key()] : json();
        if (before != it.value())
            changes.push_back({"model config." + it.key(), before.is_null() ? "(absent)" : show(before),
                               show(it.value()), true, "--model describes a different model than the checkpoint's"});
    }
    if (!recorded_device.empty() && recorded_device != device)
        changes.push_back({"--device", recorded_device, device, false,
                           "the run continues on the other backend, equal in math but not bit for bit"});

    // Data parallel: a step is the next batch x accumulation x ranks sequences of one global order
    // (DataLoader::set_rank), so the ranks and the accumulation may trade against each other: the same
    // sequences per step, summed in another order (equal to rounding). Whether the state can be
    // loaded at another number of ranks is the start's question (run_start.cpp).
    const int old_ranks = std::max(1, old_j.value("gpus", 1)), now_ranks = std::max(1, now.gpus);
    const int old_accum = old_j.value("grad-accumulation", now.grad_accumulation), now_accum = now.grad_accumulation;
    if (old_ranks != now_ranks || old_accum != now_accum) {
        const bool same = old_ranks * old_accum == now_ranks * now_accum;
        const std::string note =
            same ? cat("the same ", old_ranks * old_accum, " micro-batches per step (accumulation x ranks), from the "
                       "same global order: the run continues as the uninterrupted one would, to rounding")
                 : cat("a step would take ", now_ranks * now_accum, " micro-batches (accumulation x ranks) instead of ",
                       old_ranks * old_accum, ": another batch, and another data order from here on; keep "
                       "--grad-accumulation x ranks at ", old_ranks * old_accum,
                       old_ranks * old_accum % now_ranks == 0
                           ? cat(" (--grad-accumulation=", old_ranks * old_accum / now_ranks, " with ", now_ranks,
                                 " rank", now_ranks == 1 ? "" : "s", ")")
                           : std::string());
        if (old_ranks != now_ranks)
            changes.push_back({"--gpus (ranks)", std::to_string(old_ranks), std::to_string(now_ranks), !same, note});
        if (old_accum != now_accum)
            changes.push_back({"--grad-accumulation", std::to_string(old_accum), std::to_string(now_accum), !same, note});
    }

    // every other recorded flag, by its resume rule (option_table.cpp); a key the checkpoint lacks
    // (a flag newer than it) is not compared
    for (auto it = now_j.begin(); it != now_j.end(); ++it) {
        const std::string& key = it.key();
        const OptionSpec* spec = find_train_option(key);
        QT_CHECK(spec, "internal: to_json wrote --", key, ", which is not in the option table");
        if (spec->resume == ResumeRule::Invocation || spec->resume == ResumeRule::Resolved || !old_j.contains(key))
            continue;
        if (key == "gpus" || key == "grad-accumulation") continue;  // compared above, together
        const json& before = old_j[key];
        if (before == it.value()) continue;
        OptionChange c{"--" + key, show(before), show(it.value()), spec->resume != ResumeRule::MayChange, ""};
        if (key == "steps")
            c.note = cat("the learning-rate schedule is recomputed over ", show(it.value()),
                         " steps: from the resume point on it follows the new decay, which an uninterrupted run of ",
                         show(it.value()), " steps would have followed from the start");
        else if (key == "model")
            c.note = "allowed: the model's config is compared instead";
        else if (key == "device")
            continue;  // reported above with the resolved devices
        changes.push_back(std::move(c));
    }
    compare_resolved(old_j, old, recorded_device.empty() ? device : recorded_device, now, device, changes);
    return changes;
}

std::string describe_option_change(const OptionChange& c) {
    return cat(c.flag, ": ", c.before, " in the checkpoint, ", c.after, " now", c.note.empty() ? "" : " (",
               c.note, c.note.empty() ? "" : ")");
}

}  // namespace qtrain
