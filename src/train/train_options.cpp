#include "train/train_options.h"

#include "model/lora.h"

#include <cmath>
#include <cstdio>
#include <type_traits>
#include <variant>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "core/files.h"
#include "train/option_table.h"
#include "train/rank_devices.h"

namespace qtrain {

namespace {

// ">= 0", said plainly: CLI::NonNegativeNumber names its range as 0 to the largest double (309 digits).
CLI::Validator non_negative_check() {
    return CLI::Validator(
        [](std::string& value) -> std::string {
            double v = 0;
            if (!CLI::detail::lexical_cast(value, v)) return cat("expected a number, got '", value, "'");
            return v >= 0 ? std::string() : cat("must be >= 0, got ", value);
        },
        "NONNEGATIVE");
}

CLI::Validator unsigned_check() {
    return CLI::Validator(
        [](std::string& value) -> std::string {
            const auto first = value.find_first_not_of(" \t");
            return first != std::string::npos && value[first] == '-'
                       ? cat("must be a non-negative integer (0 to 18446744073709551615), got ", value)
                       : std::string();
        },
        "");
}

// Registers every flag of the option table (option_table.h), each in its --help group, in the
// table's order. The member's type picks the CLI11 call, so --help shows the same type names
// (INT, FLOAT, TEXT, UINT) and captured defaults as a hand-written registration would.
void add_flags(CLI::App& app, TrainOptions& o) {
    CLI::Option_group* group = nullptr;
    for (const OptionSpec& spec : train_option_table()) {
        if (!group || group->get_group() != spec.group) group = app.add_option_group(spec.group);
        std::string names = "--" + spec.name;
        for (const std::string& alias : spec.aliases) names += ",--" + alias;
        CLI::Option* opt = std::visit(
            [&](auto member) -> CLI::Option* {
                auto& field = o.*member;
                if constexpr (std::is_same_v<std::decay_t<decltype(field)>, bool>)
                    return group->add_flag(names, field, spec.help);
                else
                    return group->add_option(names, field, spec.help);
            },
            spec.member);
        if (!spec.check.choices.empty()) opt->check(CLI::IsMember(spec.check.choices));
        if (spec.check.range) opt->check(CLI::Range(spec.check.range->first, spec.check.range->second));
        if (spec.check.non_negative) opt->check(non_negative_check());
        // CLI11 converts "-1" to an unsigned field as 2^64 - 1 without a word (--seed=-1)
        const bool is_unsigned = std::visit(
            [&](auto member) {
                using F = std::decay_t<decltype(o.*member)>;
                return std::is_unsigned_v<F> && !std::is_same_v<F, bool>;
            },
            spec.member);
        if (is_unsigned) opt->check(unsigned_check());
    }
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
    validate_lora();
    if (!host_memory_limit.empty()) (void)parse_bytes(host_memory_limit, "--host-memory-limit");
}

void TrainOptions::validate_lora() const {
    QT_CHECK(lora_rank >= 0, "--lora-rank must be >= 0 (0 = off), got ", lora_rank);
    (void)parse_lora_targets(lora_targets, "--lora-targets");  // an unknown target is refused at once
    (void)parse_lora_train_also(train_also, "--train-also");
    if (lora_rank == 0) {
        // a LoRA setting without adapters would silently do nothing
        const TrainOptions defaults;
        const std::pair<const char*, bool> given[] = {{"--lora-alpha", lora_alpha != defaults.lora_alpha},
                                                      {"--lora-dropout", lora_dropout != defaults.lora_dropout},
                                                      {"--lora-targets", lora_targets != defaults.lora_targets},
                                                      {"--lora-init", lora_init != defaults.lora_init},
                                                      {"--lora-from", !lora_from.empty()},
                                                      {"--merge-lora", merge_lora},
                                                      {"--train-also", !train_also.empty()}};
        for (const auto& [flag, on] : given) QT_CHECK(!on, flag, " needs --lora-rank > 0 (LoRA is off)");
        return;
    }
    QT_CHECK(std::isfinite(lora_alpha) && lora_alpha > 0, "--lora-alpha must be a positive number, got ", lora_alpha);
    QT_CHECK(lora_dropout >= 0.0f && lora_dropout < 1.0f, "--lora-dropout must be in [0, 1), got ", lora_dropout);
}

// Each entry of the option table fills the model's fields it decides (its `to_model`), from the
// options with every implication applied (--recompute-block turns on the other recompute flags,
// --zero-level=3 --shard-weights, ...).
ModelOptions TrainOptions::model_options(const std::string& dev) const {
    const TrainOptions o = with_implications(*this);
    ModelOptions m;
    for (const OptionSpec& spec : train_option_table())
        if (spec.to_model) spec.to_model(spec, o, dev, m);
    return m;
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
