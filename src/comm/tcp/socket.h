// Blocking TCP sockets with a deadline on every wait (poll before each read, write, accept and
// connect), so a peer that dies or stops answering becomes an error instead of a hang. Internal to
// the TCP communicator; errors are qtrain::Error naming the peer (`who`: "rank 2", "rank 0 at h:p").
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace qtrain::comm::tcp {

using Clock = std::chrono::steady_clock;

// An owned file descriptor (closed on destruction).
class Socket {
public:
    Socket() = default;
    explicit Socket(int fd) : fd_(fd) {}
    ~Socket();
    Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
    Socket& operator=(Socket&& o) noexcept;
    int fd() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    void close();

private:
    int fd_ = -1;
};

// A listening socket bound to addr:port (SO_REUSEADDR, so a port left in TIME_WAIT by the previous
// run is reusable at once; a port another program listens on still fails, naming it).
Socket listen_on(const std::string& addr, int port, int backlog);
// The port a bound socket got (listen_on with port 0: tests).
int local_port(const Socket& s);
// The next connection, or an invalid Socket when none came before `deadline`.
Socket accept_until(const Socket& listener, Clock::time_point deadline);

// One attempt to connect to addr:port, waiting for the host's answer until `until` at most (a host
// that drops the connection request would otherwise hold a blocking connect for minutes).
struct ConnectAttempt {
    Socket socket;            // valid when connected
    std::string error;        // why not ("Connection refused", "no answer ...", the resolver's message)
    bool unresolvable = false; // the name does not resolve: no retry will change that. A resolver that
                               // does not answer (EAI_AGAIN) is a failed attempt like a refusal.
};
ConnectAttempt try_connect(const std::string& addr, int port, Clock::time_point until);
// Whether s has data (or its peer closed it) before `deadline`.
bool readable_before(const Socket& s, Clock::time_point deadline);

// All `bytes`, or an error naming `who`: a closed connection, a reset, or no progress before
// `deadline`.
void send_all(const Socket& s, const void* data, std::size_t bytes, Clock::time_point deadline, const std::string& who);
void recv_all(const Socket& s, void* data, std::size_t bytes, Clock::time_point deadline, const std::string& who);
// Like send_all, but never throws (reporting a failure to a peer that may be gone): false if not sent.
bool try_send_all(const Socket& s, const void* data, std::size_t bytes, Clock::time_point deadline);

// Seconds for messages, to a tenth ("12.5 s").
std::string seconds_text(Clock::duration d);

}  // namespace qtrain::comm::tcp
