#include "train/rendezvous_bound.h"

#include <fmt/format.h>

namespace qtrain {

comm::WaitBound rendezvous_bound(const TrainOptions& o) {
    comm::WaitBound b{o.rendezvous_timeout, fmt::format("--rendezvous-timeout={}", o.rendezvous_timeout)};
    if (o.comm_timeout > 0 && (!b.bounded() || o.comm_timeout < b.seconds))
        b = {o.comm_timeout, fmt::format("--comm-timeout={}, which caps {}", o.comm_timeout, b.setting)};
    return b;
}

}  // namespace qtrain
