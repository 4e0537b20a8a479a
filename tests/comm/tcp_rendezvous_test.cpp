// What a waiting rank says (issue 29, "silent waits"): the TCP rendezvous tells at once what it waits
// for, then how far it got every progress interval, and gives up after its bound naming the ranks
// that never came (rank 0) or the address it could not reach and why (the others); a name that does
// not resolve is an error at once. The ranks are threads of this process (their sockets are theirs).
#include <gtest/gtest.h>
#include <netdb.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/tcp/tcp_communicator.h"
#include "core/error.h"
#include "tcp_test_util.h"

namespace qtrain::test {
namespace {

using Clock = std::chrono::steady_clock;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
int count(const std::vector<std::string>& lines, const std::string& part) {
    int n = 0;
    for (const auto& l : lines) n += contains(l, part);
    return n;
}
std::string joined(const std::vector<std::string>& lines) {
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    return out;
}

// One rank's rendezvous: the lines it said, its error ("" if it joined) and how long it took.
struct Attempt {
    std::vector<std::string> lines;
    std::string error;
    double seconds = 0;
};
Attempt attempt(const comm::LaunchEnv& l, double timeout_s, double interval_s, const std::string& setting) {
    Attempt a;
    comm::TcpOptions o;
    o.connect_timeout = std::chrono::milliseconds(static_cast<long>(timeout_s * 1000));
    o.timeout_setting = setting;
    o.progress_interval = std::chrono::milliseconds(static_cast<long>(interval_s * 1000));
    o.progress = [&a](const std::string& line) { a.lines.push_back(line); };
    const auto t0 = Clock::now();
    try {
        auto c = comm::make_tcp_communicator(l, o);
        c->barrier();  // every rank that joined can talk
    } catch (const Error& e) {
        a.error = e.what();
    }
    a.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return a;
}

TEST(CommTcpRendezvous, RankZeroAloneSaysWhatItWaitsForThenNamesTheRanksThatNeverCame) {
    const int port = free_port();
    const std::string where = "127.0.0.1:" + std::to_string(port) + " (MASTER_ADDR:MASTER_PORT)";
    const Attempt a = attempt(launch(0, 4, port), 1.2, 0.3, "--rendezvous-timeout=1.2");
    ASSERT_FALSE(a.lines.empty());
    EXPECT_EQ(a.lines[0], "rank 0 of 4: listening on " + where +
                              "; waiting for ranks 1-3 for up to 1.2 s (--rendezvous-timeout=1.2)");
    // a progress line about every 0.3 s (3 or 4 of them before 1.2 s, on a loaded machine at least 2)
    EXPECT_GE(count(a.lines, "no rank joined; still waiting for ranks 1-3 (gives up at 1.2 s)"), 2) << joined(a.lines);
    EXPECT_TRUE(contains(a.error, "tcp: rank 0 at " + where + " waited ")) << a.error;
    EXPECT_TRUE(contains(a.error, "for ranks 1-3 of world 4, which never connected")) << a.error;
    EXPECT_TRUE(contains(a.error, "the wait is bounded by --rendezvous-timeout=1.2")) << a.error;
    EXPECT_GE(a.seconds, 1.1);
    EXPECT_LT(a.seconds, 5);
}

TEST(CommTcpRendezvous, APeerWithoutRankZeroSaysWhereItConnectsAndWhy) {
    const int port = free_port();
    comm::LaunchEnv l = launch(1, 2, port);
    l.master_addr = "127.0.0.2";  // loopback too, where nobody listens
    const std::string target = "rank 0 at 127.0.0.2:" + std::to_string(port) + " (MASTER_ADDR:MASTER_PORT)";
    const Attempt a = attempt(l, 1, 0.25, "--rendezvous-timeout=1");
    ASSERT_FALSE(a.lines.empty());
    EXPECT_EQ(a.lines[0], "rank 1 of 2: connecting to " + target + " for up to 1 s (--rendezvous-timeout=1)");
    EXPECT_GE(count(a.lines, ": no answer from " + target + " yet (Connection refused); still trying (gives up at 1 s)"),
              2)
        << joined(a.lines);
    EXPECT_TRUE(contains(a.error, "tcp: rank 1 of 2 could not connect to " + target + " within ")) << a.error;
    EXPECT_TRUE(contains(a.error, "(--rendezvous-timeout=1): Connection refused")) << a.error;
    EXPECT_LT(a.seconds, 5);
}

TEST(CommTcpRendezvous, AHostNameThatDoesNotResolveIsAnErrorAtOnce) {
    const char* host = "no-such-host.invalid";  // .invalid never resolves (RFC 2606)
    addrinfo* ai = nullptr;
    const int rc = getaddrinfo(host, "80", nullptr, &ai);
    if (ai) freeaddrinfo(ai);
    if (rc == EAI_AGAIN) GTEST_SKIP() << "no resolver answers on this machine (EAI_AGAIN is retried, by design)";
    comm::LaunchEnv l = launch(1, 2, free_port());
    l.master_addr = host;
    const Attempt a = attempt(l, 60, 10, "--rendezvous-timeout=60");
    EXPECT_TRUE(contains(a.error, "tcp: rank 1 of 2: rank 0's address MASTER_ADDR=no-such-host.invalid does not "
                                  "resolve (")) << a.error;
    EXPECT_TRUE(contains(a.error, "set MASTER_ADDR to rank 0's host name or IP address")) << a.error;
    EXPECT_LT(a.seconds, 10) << "retried instead of failing at once";
    // Slurm's derived address is named as such
    l.addr_from = "the first host of SLURM_STEP_NODELIST";
    const Attempt s = attempt(l, 60, 10, "");
    EXPECT_TRUE(contains(s.error, "no-such-host.invalid (the first host of SLURM_STEP_NODELIST) does not resolve"))
        << s.error;
}

// World 3 without rank 2: rank 1 joins rank 0, says it waits for the others, and fails with rank 0's
// verdict naming rank 2; rank 0 says who joined and who not.
TEST(CommTcpRendezvous, AJoinedPeerWaitsWithRankZeroAndHearsWhichRankIsMissing) {
    const int port = free_port();
    Attempt a0, a1;
    std::thread r0([&] { a0 = attempt(launch(0, 3, port), 1.5, 0.3, "--rendezvous-timeout=1.5"); });
    std::thread r1([&] { a1 = attempt(launch(1, 3, port), 1.5, 0.3, "--rendezvous-timeout=1.5"); });
    r0.join();
    r1.join();
    EXPECT_GE(count(a0.lines, "rank 0 of 3: "), 2) << joined(a0.lines);
    EXPECT_GE(count(a0.lines, ": rank 1 joined; still waiting for rank 2 (gives up at 1.5 s)"), 1) << joined(a0.lines);
    EXPECT_TRUE(contains(a0.error, "for rank 2 of world 3, which never connected")) << a0.error;
    EXPECT_GE(count(a1.lines, "; waiting for the other ranks (rank 0 names the ones missing)"), 1) << joined(a1.lines);
    EXPECT_TRUE(contains(a1.error, "tcp: rank 1 of 3: the rendezvous failed: ")) << a1.error;
    EXPECT_TRUE(contains(a1.error, "for rank 2 of world 3, which never connected")) << a1.error;
    EXPECT_LT(a1.seconds, 8);
}

// A late rank: the others said they were waiting, and say when everyone has joined.
TEST(CommTcpRendezvous, ALateRankIsWaitedForAndTheWaitEnds) {
    const int port = free_port();
    Attempt a0, a1;
    std::thread r0([&] { a0 = attempt(launch(0, 2, port), 20, 0.2, "--rendezvous-timeout=20"); });
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
    std::thread r1([&] { a1 = attempt(launch(1, 2, port), 20, 0.2, "--rendezvous-timeout=20"); });
    r0.join();
    r1.join();
    EXPECT_EQ(a0.error, "");
    EXPECT_EQ(a1.error, "");
    EXPECT_GE(count(a0.lines, "no rank joined; still waiting for rank 1"), 2) << joined(a0.lines);
    ASSERT_FALSE(a0.lines.empty());
    EXPECT_TRUE(contains(a0.lines.back(), "rank 0 of 2: all 2 ranks joined after ")) << joined(a0.lines);
    EXPECT_LT(a0.seconds, 10);
}

}  // namespace
}  // namespace qtrain::test
