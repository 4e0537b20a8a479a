// A test-only fault, so tests can check that one failing rank stops every rank (with an error naming
// it, never a hang) in threads mode and under mpirun alike: with QTRAIN_TEST_FAIL_RANK=<rank>:<step>
// in the environment, rank <rank> throws when it reaches step <step> (before that step's
// micro-batches); with <rank>:<step>:hang it stops there instead (sleeps forever: a rank stuck in a
// collective, which only the --comm-timeout watchdog ends). Unset or empty: no fault. Not a flag, so it cannot end up in a real command line
// or in the options a checkpoint records.
#pragma once

#include <optional>

namespace qtrain {

struct TestFault {
    int rank = 0;
    int step = 0;
    bool hang = false;
};

// The fault QTRAIN_TEST_FAIL_RANK asks for; a qtrain::Error naming the variable for a malformed value.
std::optional<TestFault> read_test_fault();

// Throws the deliberate failure when `fault` is for this rank and step.
void maybe_fail_for_test(const std::optional<TestFault>& fault, int rank, int step);

}  // namespace qtrain
