// When the CPU ops go parallel. An OpenMP region costs a wake-up and a barrier; on a small, busy
// machine (2 cores shared with a compiler) a barrier can wait a whole scheduler slice for a
// descheduled thread, which made the tiny test models 100x slower than running on one thread.
// So loops only fork when they have real work; the result is the same either way (every output is
// computed by one thread in a fixed order).
#pragma once

#include <cstdint>

namespace qtrain::cpu {

// Roughly the number of multiply-adds below which one thread finishes before a fork pays off.
inline constexpr int64_t kMinParallelWork = int64_t{1} << 16;

}  // namespace qtrain::cpu
