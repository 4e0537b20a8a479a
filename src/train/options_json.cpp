// TrainOptions as JSON, from the option table: the log's options event and a checkpoint's
// state.json record it, and --continue reads a checkpoint's back (resume_check.cpp).
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/option_table.h"
#include "train/train_options.h"

namespace qtrain {

using json = nlohmann::json;

namespace {

// The JSON value type of each member type, for the error message.
const char* json_type_name(bool TrainOptions::*) { return "a boolean"; }
const char* json_type_name(int TrainOptions::*) { return "an integer"; }
const char* json_type_name(uint64_t TrainOptions::*) { return "a non-negative integer"; }
const char* json_type_name(float TrainOptions::*) { return "a number"; }
const char* json_type_name(double TrainOptions::*) { return "a number"; }
const char* json_type_name(std::string TrainOptions::*) { return "a string"; }

// Whether `v` holds a value of the member's type, without a narrowing that would change it.
bool fits(const json& v, bool TrainOptions::*) { return v.is_boolean(); }
bool fits(const json& v, int TrainOptions::*) {
    if (v.is_number_unsigned()) return v.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max());
    if (!v.is_number_integer()) return false;
    const int64_t i = v.get<int64_t>();
    return i >= std::numeric_limits<int>::min() && i <= std::numeric_limits<int>::max();
}
bool fits(const json& v, uint64_t TrainOptions::*) {
    return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}
// floats: any JSON number (another writer may print 1.0 as 1)
bool fits(const json& v, float TrainOptions::*) { return v.is_number(); }
bool fits(const json& v, double TrainOptions::*) { return v.is_number(); }
bool fits(const json& v, std::string TrainOptions::*) { return v.is_string(); }

}  // namespace

// Each value is the member itself, so the JSON types are the C++ ones: a float is the JSON number of
// that float (1e-05 as 9.99999974737875e-06), which keeps the records of earlier versions (the same
// keys, written member by member) comparing equal.
std::string TrainOptions::to_json() const {
    json j = json::object();
    for (const OptionSpec& spec : train_option_table()) {
        if (spec.resume == ResumeRule::NotRecorded) continue;
        std::visit([&](auto member) { j[spec.name] = this->*member; }, spec.member);
    }
    return j.dump();
}

// Missing keys keep their defaults (a record from before a flag existed); unknown keys are ignored
// (a record may name a flag this version no longer has: the resume check compares the keys both know).
TrainOptions TrainOptions::from_json(const std::string& text) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        throw_error(cat("options JSON: not JSON (", e.what(), ")"));
    }
    QT_CHECK(j.is_object(), "options JSON: expected an object of flag names and values, got ", j.type_name());
    TrainOptions o;
    for (const OptionSpec& spec : train_option_table()) {
        if (spec.resume == ResumeRule::NotRecorded || !j.contains(spec.name)) continue;
        const json& v = j[spec.name];
        std::visit(
            [&](auto member) {
                QT_CHECK(fits(v, member), "options JSON: \"", spec.name, "\" must be ", json_type_name(member),
                         ", got ", v.dump());
                v.get_to(o.*member);
            },
            spec.member);
    }
    return o;
}

}  // namespace qtrain
