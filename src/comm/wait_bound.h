// How long setting up a communicator may wait for the other ranks before it gives up, and the setting
// that said so, for the error ("--rendezvous-timeout=600"): a rank that never arrives then becomes an
// error naming it instead of a silent wait. The trainer derives it from its flags (train/rendezvous_bound.h).
#pragma once

#include <chrono>
#include <string>

namespace qtrain::comm {

struct WaitBound {
    double seconds = 0;   // <= 0: no bound
    std::string setting;  // what set it, for messages; may be empty

    bool bounded() const { return seconds > 0; }
    std::chrono::milliseconds duration() const {
        return bounded() ? std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0 + 0.5))
                         : std::chrono::milliseconds(0);
    }
};

}  // namespace qtrain::comm
