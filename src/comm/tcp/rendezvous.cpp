#include "comm/tcp/rendezvous.h"

#include <algorithm>
#include <cstring>

#include "comm/tcp/wire.h"
#include "core/error.h"

namespace qtrain::comm::tcp {
namespace {

std::string cut(const std::string& s) { return s.substr(0, kMaxText); }

std::string rank_list(const std::vector<int>& ranks) {
    std::string out;
    for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
    return out;
}

// Rank 0: accepts until every rank is connected, or throws naming the missing ones.
Links accept_peers(const LaunchEnv& l, const TcpOptions& o) {
    const std::string where = cat(l.master_addr, ":", l.master_port);
    Socket listener = listen_on(l.master_addr, l.master_port, std::max(16, l.world));
    const auto start = Clock::now(), deadline = start + o.connect_timeout;
    Links links;
    links.peers.resize(static_cast<std::size_t>(l.world));
    int connected = 1;
    // A failure here tells the peers already connected why, so they fail with the same reason.
    auto fail = [&](const std::string& message) {
        for (int q = 1; q < l.world; ++q)
            if (links.peers[q].valid())
                try {
                    send_reply(links.peers[q], kFailed, l.world, message, Clock::now() + std::chrono::seconds(1), "");
                } catch (const Error&) {
                }
        throw_error(message);
    };
    while (connected < l.world) {
        Socket s = accept_until(listener, deadline);
        if (!s.valid()) {
            std::vector<int> missing;
            for (int q = 1; q < l.world; ++q)
                if (!links.peers[q].valid()) missing.push_back(q);
            fail(cat("tcp: rank 0 at ", where, " waited ", seconds_text(Clock::now() - start), " for rank",
                     missing.size() > 1 ? "s " : " ", rank_list(missing), " of world ", l.world,
                     ", which never connected (not started, or another MASTER_ADDR/MASTER_PORT?)"));
        }
        // A connection that does not say hello soon is not one of ours; it must not stall the others.
        const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
        Hello h;
        std::string token;
        try {
            recv_all(s, &h, sizeof h, hello_deadline, "a connecting process");
            if (h.magic != kMagic) continue;  // not qtrain: drop it and keep waiting
            if (h.token_len > kMaxText) continue;
            token.resize(h.token_len);
            recv_all(s, token.data(), token.size(), hello_deadline, "a connecting process");
        } catch (const Error&) {
            continue;
        }
        const int q = static_cast<int>(h.rank);
        std::string refusal;
        if (h.version != kVersion)
            refusal = cat("rank 0 at ", where, " speaks qtrain TCP protocol version ", kVersion, ", rank ", q, " ",
                          h.version, " (mixed qtrain builds?)");
        else if (token != l.run_token)
            refusal = cat("rank 0 at ", where, " belongs to another run (run token '", l.run_token, "', this rank's '",
                          token, "'): two runs on one MASTER_PORT?");
        else if (h.world != static_cast<uint32_t>(l.world)) {
            const std::string message = cat("tcp: world size mismatch at ", where, ": rank 0 has WORLD_SIZE=", l.world,
                                            ", rank ", q, " has WORLD_SIZE=", h.world);
            try {
                send_reply(s, kFailed, l.world, message, Clock::now() + std::chrono::seconds(1), "");
            } catch (const Error&) {
            }
            fail(message);
        } else if (q <= 0 || q >= l.world)
            refusal = cat("rank ", q, " is not a peer rank of world ", l.world);
        else if (links.peers[q].valid())
            refusal = cat("rank ", q, " is already connected to rank 0 at ", where,
                          " (two processes with one rank, or a second run on this port with the same run token?)");
        try {
            send_reply(s, refusal.empty() ? kOk : kFailed, l.world, refusal, hello_deadline, cat("rank ", q));
        } catch (const Error&) {
            continue;  // it went away before hearing the answer
        }
        if (!refusal.empty()) continue;
        links.peers[q] = std::move(s);
        ++connected;
    }
    listener.close();  // a late stranger now gets "connection refused", not a silent queue
    for (int q = 1; q < l.world; ++q)
        send_reply(links.peers[q], kOk, l.world, "", Clock::now() + o.io_timeout, cat("rank ", q));
    return links;
}

// Reads a Reply from rank 0, checking it is one; returns its status and text.
std::pair<uint32_t, std::string> read_reply(const Socket& s, Clock::time_point deadline, const std::string& where) {
    Reply r;
    const std::string who = cat("rank 0 at ", where);
    recv_all(s, &r, sizeof r, deadline, who);
    QT_CHECK(r.magic == kMagic && r.text_len <= kMaxText, "tcp: the process listening at ", where,
             " is not a qtrain rank 0 (another program on MASTER_PORT?)");
    std::string text(r.text_len, '\0');
    recv_all(s, text.data(), text.size(), deadline, who);
    return {r.status, text};
}

Links connect_to_root(const LaunchEnv& l, const TcpOptions& o) {
    const std::string where = cat(l.master_addr, ":", l.master_port);
    const auto deadline = Clock::now() + o.connect_timeout;
    Links links;
    links.root = connect_until(l.master_addr, l.master_port, deadline);
    Hello h;
    h.world = static_cast<uint32_t>(l.world);
    h.rank = static_cast<uint32_t>(l.rank);
    const std::string token = cut(l.run_token);
    h.token_len = static_cast<uint32_t>(token.size());
    const std::string who = cat("rank 0 at ", where);
    send_all(links.root, &h, sizeof h, deadline, who);
    send_all(links.root, token.data(), token.size(), deadline, who);
    auto [status, text] = read_reply(links.root, deadline, where);
    QT_CHECK(status == kOk, "tcp: rank ", l.rank, " refused: ", text);
    // Then wait for the others to arrive: rank 0 says when (or why not, e.g. a rank never came).
    std::tie(status, text) = read_reply(links.root, Clock::now() + o.connect_timeout + o.io_timeout, where);
    QT_CHECK(status == kOk, "tcp: rank ", l.rank, ": the rendezvous failed: ", text);
    return links;
}

}  // namespace

void send_reply(const Socket& s, uint32_t status, uint32_t world, const std::string& text, Clock::time_point deadline,
                const std::string& who) {
    const std::string t = cut(text);
    Reply r;
    r.status = status;
    r.world = world;
    r.text_len = static_cast<uint32_t>(t.size());
    send_all(s, &r, sizeof r, deadline, who);
    send_all(s, t.data(), t.size(), deadline, who);
}

Links rendezvous(const LaunchEnv& launch, const TcpOptions& options) {
    QT_CHECK(launch.world >= 1 && launch.rank >= 0 && launch.rank < launch.world, "tcp: rank ", launch.rank,
             " is not a rank of world ", launch.world);
    if (launch.world == 1) return {};  // nothing to meet
    return launch.rank == 0 ? accept_peers(launch, options) : connect_to_root(launch, options);
}

}  // namespace qtrain::comm::tcp
