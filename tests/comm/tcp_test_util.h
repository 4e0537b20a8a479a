// What the TCP backend's tests share: a free port on 127.0.0.1 and a launch as rank r of a world there.
#pragma once

#include <string>

#include "comm/launch_env.h"
#include "comm/tcp/socket.h"

namespace qtrain::test {

// A port nothing listens on now: the kernel's pick for port 0 (the race with another program taking
// it before rank 0 binds is negligible on a test machine).
inline int free_port() {
    comm::tcp::Socket s = comm::tcp::listen_on("127.0.0.1", 0, 1);
    return comm::tcp::local_port(s);
}

inline comm::LaunchEnv launch(int rank, int world, int port, const std::string& token = "t") {
    comm::LaunchEnv l;
    l.source = "test";
    l.rank = rank;
    l.world = world;
    l.master_addr = "127.0.0.1";
    l.master_port = port;
    l.run_token = token;
    return l;
}

}  // namespace qtrain::test
