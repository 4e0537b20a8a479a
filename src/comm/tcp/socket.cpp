#include "comm/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace qtrain::comm::tcp {
namespace {

std::string errno_text(int e) { return std::strerror(e); }

int ms_until(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return left <= 0 ? 0 : left > 1 << 30 ? 1 << 30 : static_cast<int>(left);
}

// Waits for `events` on fd; false at the deadline. EINTR (a signal such as SIGINT, which the trainer
// handles itself) retries rather than failing.
bool wait_for(int fd, short events, Clock::time_point deadline) {
    for (;;) {
        pollfd p{fd, events, 0};
        const int rc = ::poll(&p, 1, ms_until(deadline));
        if (rc > 0) return true;
        if (rc == 0) return false;
        if (errno != EINTR) throw_error(cat("tcp: poll failed: ", errno_text(errno)));
    }
}

struct AddrInfoDeleter {
    void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
std::unique_ptr<addrinfo, AddrInfoDeleter> resolve(const std::string& addr, int port, bool passive) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    addrinfo* out = nullptr;
    const int rc = getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &out);
    QT_CHECK(rc == 0 && out, "tcp: cannot resolve MASTER_ADDR '", addr, "': ", gai_strerror(rc));
    return std::unique_ptr<addrinfo, AddrInfoDeleter>(out);
}

// A peer's end went away: an orderly close (0), or a reset/broken pipe, which is the same event seen
// while data was still in flight, so one message names it either way.
[[noreturn]] void closed(const std::string& who, int e) {
    throw_error(cat("tcp: ", who, " closed the connection (its process ended or was killed)",
                    e ? cat(": ", errno_text(e)) : std::string()));
}

void set_nodelay(int fd) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small collectives are latency-bound
}

}  // namespace

Socket::~Socket() { close(); }
Socket& Socket::operator=(Socket&& o) noexcept {
    if (this != &o) {
        close();
        fd_ = o.fd_;
        o.fd_ = -1;
    }
    return *this;
}
void Socket::close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

Socket listen_on(const std::string& addr, int port, int backlog) {
    const auto ai = resolve(addr, port, true);
    std::string last;
    for (addrinfo* a = ai.get(); a; a = a->ai_next) {
        Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
        if (!s.valid()) continue;
        const int one = 1;
        setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(s.fd(), a->ai_addr, a->ai_addrlen) != 0) {
            const int e = errno;
            last = e == EADDRINUSE ? "the port is in use (another run, or another program listening there)"
                                   : errno_text(e);
            continue;
        }
        QT_CHECK(::listen(s.fd(), backlog) == 0, "tcp: listen on ", addr, ":", port, " failed: ", errno_text(errno));
        return s;
    }
    throw_error(cat("tcp: rank 0 cannot listen on MASTER_ADDR:MASTER_PORT = ", addr, ":", port, ": ", last,
                    " (MASTER_ADDR must be an address of rank 0's host)"));
}

int local_port(const Socket& s) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    QT_CHECK(getsockname(s.fd(), reinterpret_cast<sockaddr*>(&ss), &len) == 0, "tcp: getsockname failed");
    if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

Socket accept_until(const Socket& listener, Clock::time_point deadline) {
    while (wait_for(listener.fd(), POLLIN, deadline)) {
        Socket s(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
        if (s.valid()) {
            set_nodelay(s.fd());
            return s;
        }
        if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN)
            throw_error(cat("tcp: accept failed: ", errno_text(errno)));
    }
    return Socket();
}

ConnectAttempt try_connect(const std::string& addr, int port, Clock::time_point until) {
    ConnectAttempt out;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* raw = nullptr;
    const int rc = getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &raw);
    std::unique_ptr<addrinfo, AddrInfoDeleter> ai(raw);
    if (rc != 0) {
        out.unresolvable = rc != EAI_AGAIN && rc != EAI_SYSTEM;  // those two may pass on the next attempt
        out.error = rc == EAI_SYSTEM ? errno_text(errno) : gai_strerror(rc);
        if (!out.unresolvable) out.error = cat("cannot resolve '", addr, "' yet: ", out.error);
        return out;
    }
    out.error = "no address to try";
    for (addrinfo* a = ai.get(); a; a = a->ai_next) {
        Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
        if (!s.valid()) continue;
        int e = ::connect(s.fd(), a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
        if (e == EINPROGRESS) {
            if (!wait_for(s.fd(), POLLOUT, until)) {
                out.error = "no answer (a firewall, or no such host on the network?)";
                continue;
            }
            socklen_t len = sizeof e;
            if (getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
        }
        if (e != 0) {
            out.error = errno_text(e);
            continue;
        }
        // back to blocking like accepted sockets (every send and recv here passes MSG_DONTWAIT anyway)
        const int flags = fcntl(s.fd(), F_GETFL);
        if (flags >= 0) fcntl(s.fd(), F_SETFL, flags & ~O_NONBLOCK);
        set_nodelay(s.fd());
        out.socket = std::move(s);
        out.error.clear();
        return out;
    }
    return out;
}

bool readable_before(const Socket& s, Clock::time_point deadline) { return wait_for(s.fd(), POLLIN, deadline); }

void send_all(const Socket& s, const void* data, std::size_t bytes, Clock::time_point deadline, const std::string& who) {
    const auto* p = static_cast<const char*>(data);
    while (bytes) {
        const ssize_t n = ::send(s.fd(), p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            bytes -= static_cast<std::size_t>(n);
            continue;
        }
        if (errno == EINTR) continue;
        if (errno == EPIPE || errno == ECONNRESET) closed(who, errno);
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            throw_error(cat("tcp: sending to ", who, " failed: ", errno_text(errno)));
        if (!wait_for(s.fd(), POLLOUT, deadline))
            throw_error(cat("tcp: ", who, " has not read its data within the timeout (hung or unreachable?)"));
    }
}

bool try_send_all(const Socket& s, const void* data, std::size_t bytes, Clock::time_point deadline) {
    try {
        send_all(s, data, bytes, deadline, "");
        return true;
    } catch (const Error&) {
        return false;
    }
}

void recv_all(const Socket& s, void* data, std::size_t bytes, Clock::time_point deadline, const std::string& who) {
    auto* p = static_cast<char*>(data);
    while (bytes) {
        const ssize_t n = ::recv(s.fd(), p, bytes, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            bytes -= static_cast<std::size_t>(n);
            continue;
        }
        if (n == 0) closed(who, 0);
        if (errno == EINTR) continue;
        if (errno == ECONNRESET) closed(who, errno);
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            throw_error(cat("tcp: receiving from ", who, " failed: ", errno_text(errno)));
        if (!wait_for(s.fd(), POLLIN, deadline))
            throw_error(cat("tcp: ", who, " sent nothing within the timeout (hung or unreachable?)"));
    }
}

std::string seconds_text(Clock::duration d) {
    const auto tenths = (std::chrono::duration_cast<std::chrono::milliseconds>(d).count() + 50) / 100;
    return cat(tenths / 10.0, " s");  // "600 s", "2.5 s": a timeout's few milliseconds over say nothing
}

}  // namespace qtrain::comm::tcp
