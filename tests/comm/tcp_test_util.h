// What the TCP backend's tests share: a free port on 127.0.0.1 and a launch as rank r of a world there.
#pragma once

#include <chrono>
#include <string>
#include <thread>

#include "comm/launch_env.h"
#include "comm/tcp/socket.h"

namespace qtrain::test {

// A port nothing listens on now: the kernel's pick for port 0 (the race with another program taking
// it before rank 0 binds is negligible on a test machine).
inline int free_port() {
    comm::tcp::Socket s = comm::tcp::listen_on("127.0.0.1", 0, 1);
    return comm::tcp::local_port(s);
}

// A plain connection to a listener that may not be up yet (a stranger, not a rank): retried until
// `deadline`, an invalid socket if it never answers.
inline comm::tcp::Socket connect_stranger(int port, comm::tcp::Clock::time_point deadline) {
    for (;;) {
        comm::tcp::ConnectAttempt a = comm::tcp::try_connect("127.0.0.1", port, deadline);
        if (a.socket.valid() || comm::tcp::Clock::now() >= deadline) return std::move(a.socket);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
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
