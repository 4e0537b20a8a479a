// Reading one category of a memory plan in the plan tests (MemoryPlan::entries, model/memory_plan.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "model/memory_plan.h"

namespace qtrain::test {

// The category's device bytes (0 when the plan has none).
inline uint64_t category(const MemoryPlan& p, const std::string& name) {
    for (const auto& e : p.entries)
        if (e.category == name) return e.device_bytes;
    return 0;
}

inline bool has_category(const MemoryPlan& p, const std::string& name) {
    return std::any_of(p.entries.begin(), p.entries.end(), [&](const auto& e) { return e.category == name; });
}

}  // namespace qtrain::test
