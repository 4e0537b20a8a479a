// The TCP backend's rendezvous (tcp_communicator.h describes it). Internal.
#pragma once

#include <string>
#include <vector>

#include "comm/launch_env.h"
#include "comm/tcp/socket.h"
#include "comm/tcp/tcp_communicator.h"

namespace qtrain::comm::tcp {

struct Links {
    std::vector<Socket> peers;  // rank 0: peers[q] is rank q's connection (peers[0] unused)
    Socket root;                // other ranks: the connection to rank 0
};

Links rendezvous(const LaunchEnv& launch, const TcpOptions& options);

// A Reply with `status` and `text` (cut to kMaxText).
void send_reply(const Socket& s, uint32_t status, uint32_t world, const std::string& text, Clock::time_point deadline,
                const std::string& who);

}  // namespace qtrain::comm::tcp
