// The flags of `train` described in plain values, for the Python package (keywords, types,
// defaults and help without parsing --help): one OptionInfo per entry of the option table.
#pragma once

#include <string>
#include <vector>

namespace qtrain {

struct OptionInfo {
    std::string flag;                  // "learning-rate" (the command line's --learning-rate, the JSON key)
    std::vector<std::string> aliases;  // "lr": other names the command line takes
    // The Python keyword: the flag with '_' for '-' ("learning_rate"), except --continue (`continue`
    // is a Python keyword): "continue_from_checkpoint", TrainOptions' field, which says what it does
    // where "continue_" would not and "resume" would blur with force_resume
    std::string python;
    std::string type;                  // "bool", "int", "float" or "string"
    std::string default_value;         // as text: "false", "4", "1e-05", "cosine", "" (an empty string)
    std::string help;
    std::string group;                 // the --help section
    std::vector<std::string> choices;  // the allowed values, where the flag has a fixed set
    std::string resume;                // resume_rule_name: "must-match", "may-change", ...
};

// Every flag, in --help order.
std::vector<OptionInfo> describe_train_options();

}  // namespace qtrain
