// The TCP backend with its ranks as separate processes (fork) on 127.0.0.1: the collective checks
// every backend passes, bit for bit, and the rendezvous and failure cases, each with its error text.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "collective_checks.h"
#include "comm/tcp/socket.h"
#include "comm/tcp/tcp_communicator.h"
#include "core/error.h"
#include "tcp_test_util.h"

namespace qtrain::test {
namespace {

using Clock = std::chrono::steady_clock;
using comm::TcpOptions;

TcpOptions quick(int connect_ms = 10000, int io_ms = 20000) {
    return TcpOptions{std::chrono::milliseconds(connect_ms), std::chrono::milliseconds(io_ms)};
}

// A child process running `body`; its exception text comes back through a pipe.
struct Child {
    pid_t pid = -1;
    int pipe_fd = -1;
};
struct Outcome {
    bool ok = false;          // exited 0
    bool killed = false;      // ended by a signal (the deliberate SIGKILL)
    bool timed_out = false;   // still running at the deadline (then killed by the test)
    std::string message;      // what it threw
    double seconds = 0;       // from start() to its end
};

Child start(const std::function<void()>& body) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        int code = 0;
        std::string message;
        try {
            body();
        } catch (const std::exception& e) {
            message = e.what();
            code = 1;
        }
        if (!message.empty() && write(fds[1], message.data(), message.size()) < 0) code = 2;
        _exit(code);
    }
    close(fds[1]);
    return {pid, fds[0]};
}

// Waits for the children (killing any still alive after `timeout_s`).
std::vector<Outcome> finish(const std::vector<Child>& children, Clock::time_point started, double timeout_s = 30) {
    std::vector<Outcome> out(children.size());
    std::vector<bool> done(children.size(), false);
    const auto deadline = started + std::chrono::duration<double>(timeout_s);
    for (std::size_t left = children.size(); left;) {
        for (std::size_t i = 0; i < children.size(); ++i) {
            if (done[i]) continue;
            int status = 0;
            const bool over = Clock::now() > deadline;
            if (over) {
                kill(children[i].pid, SIGKILL);
                out[i].timed_out = true;
            }
            if (waitpid(children[i].pid, &status, over ? 0 : WNOHANG) != children[i].pid) continue;
            out[i].seconds = std::chrono::duration<double>(Clock::now() - started).count();
            out[i].ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            out[i].killed = WIFSIGNALED(status) && !out[i].timed_out;
            char buf[4096];
            for (ssize_t n; (n = read(children[i].pipe_fd, buf, sizeof buf)) > 0;)
                out[i].message.append(buf, static_cast<std::size_t>(n));
            close(children[i].pipe_fd);
            done[i] = true;
            --left;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return out;
}

// Runs body(rank) as `world` processes and returns their outcomes.
std::vector<Outcome> run_world(int world, const std::function<void(int)>& body, double timeout_s = 30) {
    const auto started = Clock::now();
    std::vector<Child> children;
    for (int r = 0; r < world; ++r) children.push_back(start([&body, r] { body(r); }));
    return finish(children, started, timeout_s);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void collective_checks(int world) {
    const int port = free_port();
    const auto outcomes = run_world(world, [&](int rank) {
        auto c = comm::make_tcp_communicator(launch(rank, world, port), quick());
        QT_CHECK(c->rank() == rank && c->world() == world && c->backend() == "tcp", "wrong rank/world/backend");
        const CheckLog log = check_everything(*c, 42);
        QT_CHECK(log.checks > 100, "only ", log.checks, " checks ran");
        std::string failures;
        for (const auto& f : log.failures) failures += f + "\n";
        QT_CHECK(log.failures.empty(), log.failures.size(), " checks failed:\n", failures);
        // An arbitrary blob (what an NCCL unique id will be) from a non-zero root too.
        for (int root = 0; root < world; ++root) {
            std::vector<std::byte> blob(128 + root);
            for (std::size_t i = 0; i < blob.size(); ++i) blob[i] = std::byte(static_cast<unsigned char>(i * 31 + root));
            const auto got = comm::broadcast_bytes(*c, rank == root ? blob : std::vector<std::byte>(3), root);
            QT_CHECK(got == blob, "broadcast_bytes from root ", root, " differs on rank ", rank);
        }
    });
    for (int r = 0; r < world; ++r) EXPECT_TRUE(outcomes[r].ok) << "rank " << r << ": " << outcomes[r].message;
}

TEST(CommTcp, CollectivesBitExactAtTwoRanks) { collective_checks(2); }
TEST(CommTcp, CollectivesBitExactAtThreeRanks) {
    ASSERT_GT(order_sensitive(world_data(42, 3, 1237)), 50) << "the data would not catch a wrong summation order";
    collective_checks(3);
}
TEST(CommTcp, OneRankNeedsNoPeers) {
    auto c = comm::make_tcp_communicator(launch(0, 1, free_port()), quick());
    const CheckLog log = check_everything(*c, 7);
    EXPECT_TRUE(log.failures.empty()) << log.failures.front();
}

TEST(CommTcp, MismatchedWorldSizesFailOnBothSides) {
    const int port = free_port();
    const auto o = run_world(2, [&](int rank) {
        comm::make_tcp_communicator(launch(rank, rank == 0 ? 2 : 3, port), quick());
    });
    const std::string where = "127.0.0.1:" + std::to_string(port);
    for (int r = 0; r < 2; ++r) {
        EXPECT_FALSE(o[r].ok) << "rank " << r;
        EXPECT_TRUE(contains(o[r].message, "world size mismatch at " + where)) << o[r].message;
        EXPECT_TRUE(contains(o[r].message, "WORLD_SIZE=2") && contains(o[r].message, "WORLD_SIZE=3")) << o[r].message;
    }
}

TEST(CommTcp, ARankThatNeverArrivesIsNamed) {
    const int port = free_port();
    // World 4, ranks 2 and 3 never start: rank 0 gives up after its connect timeout and says so to rank 1.
    const auto o = run_world(2, [&](int rank) { comm::make_tcp_communicator(launch(rank, 4, port), quick(1000)); });
    for (int r = 0; r < 2; ++r) {
        EXPECT_FALSE(o[r].ok);
        EXPECT_TRUE(contains(o[r].message, "for ranks 2, 3 of world 4, which never connected")) << o[r].message;
        EXPECT_LT(o[r].seconds, 6) << "rank " << r << " took too long to give up";
    }
}

TEST(CommTcp, APortInUseOrANonQtrainListenerIsAClearError) {
    // Something else (this test) listens on the port.
    comm::tcp::Socket other = comm::tcp::listen_on("127.0.0.1", 0, 4);
    const int port = comm::tcp::local_port(other);
    try {
        comm::make_tcp_communicator(launch(0, 2, port), quick());
        ADD_FAILURE() << "rank 0 started on a port in use";
    } catch (const Error& e) {
        EXPECT_TRUE(contains(e.what(), "127.0.0.1:" + std::to_string(port))) << e.what();
        EXPECT_TRUE(contains(e.what(), "in use")) << e.what();
    }
    // A peer reaching that program gets an answer that is not qtrain's.
    std::thread server([&] {
        comm::tcp::Socket s = comm::tcp::accept_until(other, Clock::now() + std::chrono::seconds(5));
        const char junk[] = "HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
        if (s.valid()) comm::tcp::try_send_all(s, junk, sizeof junk, Clock::now() + std::chrono::seconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    });
    try {
        comm::make_tcp_communicator(launch(1, 2, port), quick(3000));
        ADD_FAILURE() << "rank 1 accepted a non-qtrain rank 0";
    } catch (const Error& e) {
        EXPECT_TRUE(contains(e.what(), "127.0.0.1:" + std::to_string(port) + " is not a qtrain rank 0")) << e.what();
    }
    server.join();
}

TEST(CommTcp, StrangersAreRefusedAndRankZeroKeepsWaiting) {
    const int port = free_port();
    const auto started = Clock::now();
    std::vector<Child> children;
    children.push_back(start([&] {
        auto c = comm::make_tcp_communicator(launch(0, 2, port, "run-A"), quick());
        float x = 1, y = 0;
        c->all_reduce(&x, &y, 1, DType::F32);
        QT_CHECK(y == 3, "rank 0 summed ", y);
    }));
    // A non-qtrain connection (garbage, then silence) must be dropped, not taken for a rank.
    comm::tcp::Socket junk = connect_stranger(port, Clock::now() + std::chrono::seconds(5));
    ASSERT_TRUE(junk.valid()) << "rank 0 never listened";
    const char text[] = "GET / HTTP/1.0\r\n\r\n........";
    comm::tcp::send_all(junk, text, sizeof text, Clock::now() + std::chrono::seconds(1), "rank 0");
    // A rank of another run (another token) is refused by name.
    try {
        comm::make_tcp_communicator(launch(1, 2, port, "run-B"), quick());
        ADD_FAILURE() << "a rank of another run was accepted";
    } catch (const Error& e) {
        EXPECT_TRUE(contains(e.what(), "belongs to another run (run token 'run-A', this rank's 'run-B')")) << e.what();
    }
    children.push_back(start([&] {
        auto c = comm::make_tcp_communicator(launch(1, 2, port, "run-A"), quick());
        float x = 2, y = 0;
        c->all_reduce(&x, &y, 1, DType::F32);
        QT_CHECK(y == 3, "rank 1 summed ", y);
    }));
    const auto o = finish(children, started);
    for (int r = 0; r < 2; ++r) EXPECT_TRUE(o[r].ok) << "rank " << r << ": " << o[r].message;
}

// A rank's process is killed between two all-reduces: the others fail naming it, quickly (the
// connection closes; the 20 s io timeout must not be what ends them).
void killed_rank(int victim) {
    const int port = free_port();
    const auto o = run_world(3, [&](int rank) {
        auto c = comm::make_tcp_communicator(launch(rank, 3, port), quick());
        std::vector<float> x(64, 1.0f);
        c->all_reduce(x.data(), x.data(), x.size(), DType::F32);
        if (rank == victim) raise(SIGKILL);
        c->all_reduce(x.data(), x.data(), x.size(), DType::F32);
        c->barrier();
    });
    EXPECT_TRUE(o[victim].killed);
    for (int r = 0; r < 3; ++r) {
        if (r == victim) continue;
        EXPECT_FALSE(o[r].ok || o[r].timed_out) << "rank " << r;
        EXPECT_TRUE(contains(o[r].message, "rank " + std::to_string(victim) + " closed the connection")) << o[r].message;
        EXPECT_TRUE(contains(o[r].message, "all_reduce #2")) << o[r].message;
        EXPECT_LT(o[r].seconds, 8) << "rank " << r << ": " << o[r].message;
    }
}
TEST(CommTcp, AKilledPeerFailsTheOthersNamingIt) { killed_rank(2); }
TEST(CommTcp, AKilledRankZeroFailsThePeersNamingIt) { killed_rank(0); }

TEST(CommTcp, AbortAndMismatchedCollectivesAreReported) {
    const int port = free_port();
    const auto o = run_world(3, [&](int rank) {
        auto c = comm::make_tcp_communicator(launch(rank, 3, port), quick());
        float x = 1;
        if (rank == 1) c->broadcast(&x, 1, DType::F32, 0);  // the others all-reduce
        else c->all_reduce(&x, &x, 1, DType::F32);
    });
    for (int r = 0; r < 3; ++r) {
        EXPECT_FALSE(o[r].ok);
        EXPECT_TRUE(contains(o[r].message, "rank 1 called broadcast #1")) << o[r].message;
    }
    const int port2 = free_port();
    const auto a = run_world(2, [&](int rank) {
        auto c = comm::make_tcp_communicator(launch(rank, 2, port2), quick());
        if (rank == 1) {
            c->abort("out of memory");
            return;
        }
        c->barrier();
    });
    EXPECT_TRUE(a[1].ok) << a[1].message;
    EXPECT_TRUE(contains(a[0].message, "rank 1 of 2 failed: out of memory")) << a[0].message;
}

}  // namespace
}  // namespace qtrain::test
