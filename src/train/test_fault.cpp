#include "train/test_fault.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace qtrain {

namespace {

constexpr const char* kVariable = "QTRAIN_TEST_FAIL_RANK";

bool parse_count(const std::string& s, int* out) {
    if (s.empty() || s.size() > 9) return false;
    for (char c : s)
        if (c < '0' || c > '9') return false;
    *out = static_cast<int>(std::strtol(s.c_str(), nullptr, 10));
    return true;
}

}  // namespace

std::optional<TestFault> read_test_fault() {
    const char* value = std::getenv(kVariable);
    if (!value || !*value) return std::nullopt;
    const std::string v = value;
    const std::size_t colon = v.find(':');
    TestFault f;
    QT_CHECK(colon != std::string::npos && parse_count(v.substr(0, colon), &f.rank) &&
                 parse_count(v.substr(colon + 1), &f.step),
             kVariable, "='", v, "': expected <rank>:<step> (a test-only hook: that rank fails at that step)");
    return f;
}

void maybe_fail_for_test(const std::optional<TestFault>& fault, int rank, int step) {
    if (fault && fault->rank == rank && fault->step == step)
        throw_error(cat("deliberate failure at step ", step, " (", kVariable, "=", rank, ":", step, ", a test hook)"));
}

}  // namespace qtrain
