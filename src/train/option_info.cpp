#include "train/option_info.h"

#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "train/option_table.h"

namespace qtrain {

namespace {

const char* type_name(bool TrainOptions::*) { return "bool"; }
const char* type_name(int TrainOptions::*) { return "int"; }
const char* type_name(uint64_t TrainOptions::*) { return "int"; }
const char* type_name(float TrainOptions::*) { return "float"; }
const char* type_name(double TrainOptions::*) { return "float"; }
const char* type_name(std::string TrainOptions::*) { return "string"; }

// fmt's shortest text that reads back as the same value (1e-05, 0.95), and true/false for bools:
// what Python's int(), float() and a bool test take.
template <class V>
std::string as_text(const V& value) {
    if constexpr (std::is_same_v<V, bool>) return value ? "true" : "false";
    else if constexpr (std::is_same_v<V, std::string>) return value;
    else return fmt::format("{}", value);
}

std::string python_keyword(const OptionSpec& spec) {
    if (!spec.python.empty()) return spec.python;
    std::string k = spec.name;
    for (char& c : k)
        if (c == '-') c = '_';
    return k;
}

}  // namespace

std::vector<OptionInfo> describe_train_options() {
    const TrainOptions defaults;
    std::vector<OptionInfo> out;
    for (const OptionSpec& spec : train_option_table()) {
        OptionInfo info;
        info.flag = spec.name;
        info.aliases = spec.aliases;
        info.python = python_keyword(spec);
        std::visit(
            [&](auto member) {
                info.type = type_name(member);
                info.default_value = as_text(defaults.*member);
            },
            spec.member);
        info.help = spec.help;
        info.group = spec.group;
        info.choices = spec.check.choices;
        info.resume = resume_rule_name(spec.resume);
        out.push_back(std::move(info));
    }
    return out;
}

}  // namespace qtrain
