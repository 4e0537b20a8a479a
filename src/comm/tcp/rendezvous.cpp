#include "comm/tcp/rendezvous.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "comm/tcp/wire.h"
#include "core/error.h"

namespace qtrain::comm::tcp {
namespace {

std::string cut(const std::string& s) { return s.substr(0, kMaxText); }

// "1, 2" or, for runs of three or more, "1-4, 7": a world of thousands stays one line.
std::string rank_list(const std::vector<int>& ranks) {
    std::string out;
    for (std::size_t i = 0; i < ranks.size();) {
        std::size_t j = i;
        while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
        if (!out.empty()) out += ", ";
        out += std::to_string(ranks[i]);
        if (j >= i + 2) {
            out += '-';
            out += std::to_string(ranks[j]);
            i = j + 1;
        } else {
            ++i;
        }
    }
    return out;
}
std::string ranks_text(const std::vector<int>& ranks) {
    return cat(ranks.size() > 1 ? "ranks " : "rank ", rank_list(ranks));
}

// The deadline `timeout` after `start`, or never (timeout <= 0).
Clock::time_point deadline_after(Clock::time_point start, std::chrono::milliseconds timeout) {
    return timeout.count() > 0 ? start + timeout : Clock::time_point::max();
}
// "for up to 600 s (--rendezvous-timeout=600)", for the first line.
std::string limit_text(const TcpOptions& o) {
    const std::string setting = o.timeout_setting.empty() ? "" : cat(" (", o.timeout_setting, ")");
    if (o.connect_timeout.count() <= 0) return "with no time limit" + setting;
    return cat("for up to ", o.connect_timeout.count() / 1000.0, " s", setting);
}
// "gives up at 600 s", for the progress lines.
std::string gives_up_text(const TcpOptions& o) {
    if (o.connect_timeout.count() <= 0) return "no time limit";
    return cat("gives up at ", o.connect_timeout.count() / 1000.0, " s");
}
// "127.0.0.1:29500 (MASTER_ADDR:MASTER_PORT)": the address and where it came from.
std::string address_text(const LaunchEnv& l) {
    if (l.addr_from == "MASTER_ADDR" && l.port_from == "MASTER_PORT")
        return cat(l.master_addr, ":", l.master_port, " (MASTER_ADDR:MASTER_PORT)");
    return cat(l.master_addr, ":", l.master_port, " (host: ", l.addr_from, "; port: ", l.port_from, ")");
}

// The rendezvous's lines to the user: one at once, then one per interval while it waits.
class Progress {
public:
    Progress(const TcpOptions& o, Clock::time_point start)
        : o_(o), start_(start),
          next_(o.progress && o.progress_interval.count() > 0 ? start + o.progress_interval : Clock::time_point::max()) {}
    void say(const std::string& line) const {
        if (o_.progress) o_.progress(line);
    }
    // When the next periodic line is due (the latest a wait may last before checking due()).
    Clock::time_point next() const { return next_; }
    // Whether a periodic line is due now; if so it counts as said and the next one is scheduled.
    bool due() {
        if (Clock::now() < next_) return false;
        next_ = Clock::now() + o_.progress_interval;
        reported_ = true;
        return true;
    }
    bool reported() const { return reported_; }
    std::string elapsed() const {
        return cat(std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start_).count(), " s");
    }

private:
    const TcpOptions& o_;
    Clock::time_point start_, next_;
    bool reported_ = false;
};

// Rank 0: accepts until every rank is connected, or throws naming the missing ones.
Links accept_peers(const LaunchEnv& l, const TcpOptions& o) {
    const std::string where = cat(l.master_addr, ":", l.master_port), me = cat("rank 0 of ", l.world);
    Socket listener = listen_on(l.master_addr, l.master_port, std::max(16, l.world));
    const auto start = Clock::now(), deadline = deadline_after(start, o.connect_timeout);
    Progress progress(o, start);
    Links links;
    links.peers.resize(static_cast<std::size_t>(l.world));
    int connected = 1;
    auto ranks_where = [&](bool joined) {
        std::vector<int> out;
        for (int q = 1; q < l.world; ++q)
            if (links.peers[q].valid() == joined) out.push_back(q);
        return out;
    };
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
    progress.say(cat(me, ": listening on ", address_text(l), "; waiting for ", ranks_text(ranks_where(false)), " ",
                     limit_text(o)));
    while (connected < l.world) {
        if (progress.due()) {
            const std::vector<int> joined = ranks_where(true);
            progress.say(cat(me, ": ", progress.elapsed(), ": ", joined.empty() ? "no rank" : ranks_text(joined),
                             " joined; still waiting for ", ranks_text(ranks_where(false)), " (", gives_up_text(o), ")"));
        }
        Socket s = accept_until(listener, std::min(deadline, progress.next()));
        if (!s.valid()) {
            if (Clock::now() < deadline) continue;  // time for a progress line
            const std::vector<int> missing = ranks_where(false);
            fail(cat("tcp: rank 0 at ", address_text(l), " waited ", seconds_text(Clock::now() - start), " for rank",
                     missing.size() > 1 ? "s " : " ", rank_list(missing), " of world ", l.world,
                     ", which never connected (not started, or another MASTER_ADDR/MASTER_PORT?)",
                     o.timeout_setting.empty() ? "" : "; the wait is bounded by ", o.timeout_setting));
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
    if (progress.reported()) progress.say(cat(me, ": all ", l.world, " ranks joined after ", progress.elapsed()));
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
    const std::string where = cat(l.master_addr, ":", l.master_port), me = cat("rank ", l.rank, " of ", l.world);
    const std::string target = cat("rank 0 at ", address_text(l));
    const auto start = Clock::now(), deadline = deadline_after(start, o.connect_timeout);
    Progress progress(o, start);
    progress.say(cat(me, ": connecting to ", target, " ", limit_text(o)));
    Links links;
    for (;;) {
        ConnectAttempt a = try_connect(l.master_addr, l.master_port, std::min(deadline, progress.next()));
        if (a.socket.valid()) {
            links.root = std::move(a.socket);
            break;
        }
        // A name no resolver knows stays unknown: waiting out the timeout would only hide the typo.
        QT_CHECK(!a.unresolvable, "tcp: ", me, ": rank 0's address ",
                 l.addr_from == "MASTER_ADDR" ? cat("MASTER_ADDR=", l.master_addr) : cat(l.master_addr, " (", l.addr_from, ")"),
                 " does not resolve (", a.error, "): set MASTER_ADDR to rank 0's host name or IP address");
        if (Clock::now() >= deadline)
            throw_error(cat("tcp: ", me, " could not connect to ", target, " within ", seconds_text(Clock::now() - start),
                            o.timeout_setting.empty() ? "" : " (", o.timeout_setting,
                            o.timeout_setting.empty() ? "" : ")", ": ", a.error,
                            " (is rank 0 running, and is that its address?)"));
        if (progress.due())
            progress.say(cat(me, ": ", progress.elapsed(), ": no answer from ", target, " yet (", a.error,
                             "); still trying (", gives_up_text(o), ")"));
        std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(50), deadline - Clock::now()));
    }
    // Rank 0 answers a hello at once (or drops a connection that sends none within 5 s).
    const auto hello_deadline = Clock::now() + std::chrono::seconds(10);
    Hello h;
    h.world = static_cast<uint32_t>(l.world);
    h.rank = static_cast<uint32_t>(l.rank);
    const std::string token = cut(l.run_token);
    h.token_len = static_cast<uint32_t>(token.size());
    const std::string who = cat("rank 0 at ", where);
    send_all(links.root, &h, sizeof h, hello_deadline, who);
    send_all(links.root, token.data(), token.size(), hello_deadline, who);
    auto [status, text] = read_reply(links.root, hello_deadline, where);
    QT_CHECK(status == kOk, "tcp: rank ", l.rank, " refused: ", text);
    // Then wait for the others to arrive: rank 0 says when, or why not (naming the ranks that never
    // came). Its own limit ends at most the bound after now (it started before this connection), so
    // waiting that long and a little more hears its verdict rather than guessing.
    const auto verdict_deadline = deadline_after(Clock::now() + std::chrono::seconds(5), o.connect_timeout);
    while (!readable_before(links.root, std::min(verdict_deadline, progress.next()))) {
        if (Clock::now() >= verdict_deadline)
            throw_error(cat("tcp: ", me, ": joined ", target, " but rank 0 did not say within ",
                            seconds_text(Clock::now() - start), " that all ranks arrived (hung?)"));
        if (progress.due())
            progress.say(cat(me, ": ", progress.elapsed(), ": joined ", target,
                             "; waiting for the other ranks (rank 0 names the ones missing)"));
    }
    std::tie(status, text) = read_reply(links.root, Clock::now() + std::chrono::seconds(10), where);
    QT_CHECK(status == kOk, "tcp: ", me, ": the rendezvous failed: ", text);
    if (progress.reported()) progress.say(cat(me, ": all ", l.world, " ranks joined after ", progress.elapsed()));
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
