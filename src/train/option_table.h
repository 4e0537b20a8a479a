// The flags of `train`, one entry each: the single source of truth for the CLI registration
// (`--help`, train_options.cpp), the JSON a log and a checkpoint record (TrainOptions::to_json /
// from_json, options_json.cpp), what `--continue` compares (resume_check.cpp) and what the Python
// package is told about them (option_info.h), what the model is given (TrainOptions::model_options:
// each entry's `to_model` and `implies`), how memory_fit names the flags it suggests and how the
// models' messages name them (model/flag_names.h). A new flag is a field of TrainOptions plus one
// entry in option_table.cpp (and, when the model reads it, a field of ModelOptions that the entry
// fills); nothing else lists flags.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "model/flag_names.h"
#include "train/train_options.h"

namespace qtrain {

// What `--continue` does with a flag whose value differs from the checkpoint's.
enum class ResumeRule {
    MustMatch,    // changes the math or the data: refused unless --force-resume
    MayChange,    // paths, intervals, --steps, memory and speed settings: reported, allowed
    Invocation,   // says how this invocation behaves (--continue, --overwrite, ...): never reported
    Resolved,     // "" or -1 means a default that depends on the device or --steps: compared resolved
    NotRecorded,  // an action, not a setting of a run (--export-checkpoint exports and exits, it never
                  // trains): left out of to_json, so never in a log or a checkpoint
};

// The TrainOptions field a flag sets; its type decides the CLI11 registration (bool: a flag without
// a value), the JSON value type and the Python type.
using OptionMember = std::variant<bool TrainOptions::*, int TrainOptions::*, uint64_t TrainOptions::*,
                                  float TrainOptions::*, double TrainOptions::*, std::string TrainOptions::*>;

// The value checks CLI11 applies while parsing (the rest is TrainOptions::validate's); at most one.
struct OptionCheck {
    std::vector<std::string> choices;         // IsMember
    std::optional<std::pair<int, int>> range; // Range, inclusive (ints: the help says "INT in [1 - 3]")
    bool non_negative = false;                // NonNegativeNumber
};

// A flag that another one turns on (--recompute-block implies --recompute-ffn, --zero-level=3 implies
// --shard-weights): TrainOptions::model_options applies these, transitively, before filling the model's
// options, so the model and memory_fit's suggestions see one meaning of each flag.
struct OptionImplication {
    bool TrainOptions::* flag = nullptr;  // the implied boolean flag, turned on
    int from = 1;                         // when the implying flag's value is at least this (a bool: when given)
    bool several_ranks = false;           // only with --gpus > 1
};

// Fills the ModelOptions fields a flag decides from the options (implications applied) and the
// resolved device ("cpu" or "cuda"); entries are applied in table order, so a default may depend on
// an earlier entry's field (--matmul-dtype's on --model-dtype's). A bad value is a qtrain::Error
// naming the flag ("--" + spec.name).
struct OptionSpec;
using ModelSetter =
    std::function<void(const OptionSpec& spec, const TrainOptions& o, const std::string& device, ModelOptions& m)>;

struct OptionSpec {
    std::string name;                  // long name without "--": the JSON key ("learning-rate")
    std::vector<std::string> aliases;  // more long names ("lr"), accepted on the command line only
    std::string group;                 // the --help section
    OptionMember member;
    ResumeRule resume = ResumeRule::MustMatch;  // the safe side: a change is refused
    std::string help;
    OptionCheck check;
    std::string python;                // the Python keyword, where the name with '_' for '-' cannot be
                                       // one ("continue"); "" = that name
    ModelSetter to_model;              // the model's fields it fills (TrainOptions::model_options); empty = none
    // What the models' messages name this flag by (model/flag_names.h): the ModelOptions field
    // `.model(&ModelOptions::x)` fills, or what `.names(...)` says; the table registers "--name" under it.
    std::optional<ModelFlag> model_flag;
    std::vector<OptionImplication> implies;
};

// Every flag, in --help order (groups in the order they first appear). Building it (the first call)
// registers each entry's name under its `model_flag` (model/flag_names.h), the names the models print.
const std::vector<OptionSpec>& train_option_table();
// The entry named `name` (no "--"; aliases are not looked up), or nullptr.
const OptionSpec* find_train_option(std::string_view name);
// The entry that sets `member` (a field of TrainOptions); every field has one (throws otherwise).
const OptionSpec& train_option_of(const OptionMember& member);
// "--name", the flag as the command line and the messages spell it.
std::string flag_name(const OptionSpec& spec);
// `o` with every implication of the table applied (transitively): the flags in effect.
TrainOptions with_implications(TrainOptions o);
// "must-match", "may-change", "invocation", "resolved", "not-recorded".
const char* resume_rule_name(ResumeRule rule);

}  // namespace qtrain
