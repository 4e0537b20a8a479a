// PeerWatch (comm/peer_watch.h): the process of a rank on this host that ends mid-job is named once;
// at the normal end (finishing()) nothing is said.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/peer_watch.h"

namespace qtrain::test {
namespace {

using Clock = std::chrono::steady_clock;

pid_t sleeping_child() {
    const pid_t pid = fork();
    if (pid == 0) {
        for (;;) pause();
    }
    return pid;
}

struct Said {
    std::mutex mutex;
    std::vector<std::string> lines;
    void add(const std::string& l) {
        std::lock_guard lock(mutex);
        lines.push_back(l);
    }
    std::vector<std::string> get() {
        std::lock_guard lock(mutex);
        return lines;
    }
};

// Waits up to `seconds` for something to be said.
std::vector<std::string> wait_for_lines(Said& said, double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (said.get().empty() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return said.get();
}

TEST(CommPeerWatch, AProcessIsGoneWhenItEndedEvenBeforeItIsReaped) {
    EXPECT_FALSE(comm::process_gone(getpid()));
    const pid_t child = sleeping_child();
    ASSERT_GT(child, 0);
    EXPECT_FALSE(comm::process_gone(child));
    kill(child, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(comm::process_gone(child)) << "a zombie (ended, not reaped) counts as gone";
    waitpid(child, nullptr, 0);
    EXPECT_TRUE(comm::process_gone(child));
}

TEST(CommPeerWatch, APeerKilledMidJobIsNamedOnce) {
    const pid_t a = sleeping_child(), b = sleeping_child();
    ASSERT_GT(a, 0);
    ASSERT_GT(b, 0);
    Said said;
    {
        comm::PeerWatch watch("rank 0 of 3", {{1, a}, {2, b}}, [&](const std::string& l) { said.add(l); },
                              std::chrono::milliseconds(20));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        EXPECT_TRUE(said.get().empty()) << "both peers live";
        kill(b, SIGKILL);
        const auto lines = wait_for_lines(said, 5);
        ASSERT_EQ(lines.size(), 1u);
        EXPECT_EQ(lines[0].rfind("rank 0 of 3: rank 2 (pid " + std::to_string(b) + " on this host) has ended while "
                                 "the job runs; unless it printed an error of its own above, it was killed",
                                 0),
                  0u)
            << lines[0];
        kill(a, SIGKILL);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        EXPECT_EQ(said.get().size(), 1u) << "once";
    }
    waitpid(a, nullptr, 0);
    waitpid(b, nullptr, 0);
}

TEST(CommPeerWatch, NothingIsSaidOnceTheJobIsFinishing) {
    const pid_t a = sleeping_child();
    ASSERT_GT(a, 0);
    Said said;
    {
        comm::PeerWatch watch("rank 0 of 2", {{1, a}}, [&](const std::string& l) { said.add(l); },
                              std::chrono::milliseconds(20));
        watch.finishing();
        kill(a, SIGKILL);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    EXPECT_TRUE(said.get().empty()) << said.get().front();
    waitpid(a, nullptr, 0);
}

}  // namespace
}  // namespace qtrain::test
