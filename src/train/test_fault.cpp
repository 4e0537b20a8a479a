#include "train/test_fault.h"

#include <chrono>
#include <cstdlib>
#include <thread>
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
    std::string step = colon == std::string::npos ? std::string() : v.substr(colon + 1);
    if (const std::size_t h = step.find(':'); h != std::string::npos && step.substr(h) == ":hang") {
        f.hang = true;
        step.resize(h);
    }
    QT_CHECK(colon != std::string::npos && parse_count(v.substr(0, colon), &f.rank) && parse_count(step, &f.step),
             kVariable, "='", v, "': expected <rank>:<step> or <rank>:<step>:hang (a test-only hook: that rank fails, "
             "or stops, at that step)");
    return f;
}

void maybe_fail_for_test(const std::optional<TestFault>& fault, int rank, int step) {
    if (!fault || fault->rank != rank || fault->step != step) return;
    if (fault->hang)
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    throw_error(cat("deliberate failure at step ", step, " (", kVariable, "=", rank, ":", step, ", a test hook)"));
}

}  // namespace qtrain
