// torchrun-style launch through `train` (issue 19, many nodes; here on loopback): two processes with
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set meet over the TCP communicator and train
// exactly as threads mode does with --gpus=2 (the same sums in the same order: the same bits); a rank
// that fails ends both with its error, within the timeout. A rank whose peers never come says at once
// what it waits for, then how far it got, and gives up after --rendezvous-timeout (issue 29).
#include <gtest/gtest.h>
#include <netdb.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "comm/tcp/socket.h"
#include "test_util.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;

namespace {

const std::string kLimit = "timeout 120 ";

// A port nothing listens on now (the kernel's pick for port 0).
int free_port() {
    comm::tcp::Socket s = comm::tcp::listen_on("127.0.0.1", 0, 1);
    return comm::tcp::local_port(s);
}

// Both ranks of `cmd` as torchrun would start them: rank 1 in the background (its output in `log1`),
// rank 0 in the foreground; the shell's exit code is rank 0's, after waiting for rank 1.
std::string two_ranks(const std::string& cmd, const std::string& log1, const std::string& extra_env = "") {
    const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) + " WORLD_SIZE=2 " +
                            extra_env + " ";
    return "sh -c '" + env + "RANK=1 LOCAL_RANK=1 " + kLimit + cmd + " > " + log1 + " 2>&1 & " + env +
           "RANK=0 LOCAL_RANK=0 " + kLimit + cmd + "; rc=$?; wait; exit $rc'";
}

}  // namespace

// `common` under threads mode (--gpus=2) and as two torchrun-launched processes: the same losses,
// evaluations and exported bytes; returns the torchrun run's output.
static std::string expect_torchrun_equals_threads(Fixture& f, const std::string& common) {
    auto threads = run_command(kLimit + f.base_cmd("threads") + common + " --gpus=2");
    EXPECT_EQ(threads.exit_code, 0) << threads.output;
    auto tcp = run_command(two_ranks(f.base_cmd("tcp") + common, f.dir / "rank1.log"));
    EXPECT_EQ(tcp.exit_code, 0) << tcp.output << "\nrank 1:\n" << read_file(f.dir / "rank1.log");
    EXPECT_EQ(step_losses(f.dir / "threads/log.jsonl"), step_losses(f.dir / "tcp/log.jsonl"));
    EXPECT_EQ(event_values(f.dir / "threads/log.jsonl", "eval", "loss"), event_values(f.dir / "tcp/log.jsonl", "eval", "loss"));
    EXPECT_EQ(read_file(f.dir / "threads/model.safetensors"), read_file(f.dir / "tcp/model.safetensors"));
    return tcp.output;
}

TEST(TrainCliTcp, TwoProcessesWithTorchrunVariablesTrainAsThreadsMode) {
    Fixture f;
    const std::string out =
        expect_torchrun_equals_threads(f, " --steps=6 --eval-every-n-steps=3 --eval-num-steps=2 --ckpt-interval=3");
    EXPECT_TRUE(Contains(out, "torchrun mode: 2 CPU ranks")) << out;
    EXPECT_EQ(step_losses(f.dir / "tcp/log.jsonl").size(), 6u);
}

TEST(TrainCliTcp, AFailingRankEndsBothWithItsError) {
    Fixture f;
    auto r = run_command(two_ranks(f.base_cmd("fail") + " --steps=6 --eval-every-n-steps=0", f.dir / "rank1.log",
                                   "QTRAIN_TEST_FAIL_RANK=1:2"));
    const std::string rank1 = read_file(f.dir / "rank1.log");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "rank 0 hung:\n" << r.output;
    EXPECT_TRUE(Contains(rank1, "rank 1 of 2 failed: deliberate failure at step 2")) << rank1;
    EXPECT_TRUE(Contains(r.output, "rank 1")) << r.output;
    EXPECT_EQ(step_losses(f.dir / "fail/log.jsonl").size(), 2u);
}

// ZeRO-3 under the torchrun launch: every forward gathers the layers over the TCP communicator, and
// the run is threads mode's ZeRO-3 bit for bit (which is ZeRO-1's, train_cli_zero3_test.cpp).
TEST(TrainCliTcp, ZeroThreeTrainsAsThreadsMode) {
    Fixture f;
    const std::string out =
        expect_torchrun_equals_threads(f, " --steps=4 --eval-every-n-steps=2 --eval-num-steps=3 --zero-level=3");
    EXPECT_TRUE(Contains(out, "ZeRO-3")) << out;
    EXPECT_EQ(step_losses(f.dir / "tcp/log.jsonl").size(), 4u);
}

// A rank that hangs in a step (QTRAIN_TEST_FAIL_RANK=1:2:hang sleeps forever, as a rank stuck in a
// GPU collective would wait): the --comm-timeout watchdog ends it, saying why, and the other rank
// stops too, long before the communicator's own hour-long timeout.
TEST(TrainCliTcp, AHangingRankIsEndedByTheCommTimeout) {
    Fixture f;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = run_command(two_ranks(f.base_cmd("hang") + " --steps=6 --eval-every-n-steps=0 --comm-timeout=2",
                                   f.dir / "rank1.log", "QTRAIN_TEST_FAIL_RANK=1:2:hang"));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string rank1 = read_file(f.dir / "rank1.log");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "rank 0 hung:\n" << r.output;
    EXPECT_TRUE(Contains(rank1, "rank 1: step 2 made no progress")) << rank1;
    EXPECT_TRUE(Contains(rank1, "--comm-timeout=2")) << rank1;
    EXPECT_LT(seconds, 60.0) << r.output;
    EXPECT_EQ(step_losses(f.dir / "hang/log.jsonl").size(), 2u);
}

namespace {

struct Timed {
    RunResult result;
    double seconds;
};
// `cmd` with only its stderr kept (a rank > 0 has its stdout on /dev/null: whatever it must say goes to
// stderr), timed.
Timed stderr_of(const std::string& cmd) {
    const auto t0 = std::chrono::steady_clock::now();
    RunResult r = run_command("sh -c '" + kLimit + cmd + " 2>&1 >/dev/null'");
    return {r, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}
std::string torchrun_env(int rank, int world, const std::string& addr, int port) {
    return "env QTRAIN_RENDEZVOUS_PROGRESS_SECONDS=0.5 MASTER_ADDR=" + addr + " MASTER_PORT=" + std::to_string(port) +
           " WORLD_SIZE=" + std::to_string(world) + " RANK=" + std::to_string(rank) +
           " LOCAL_RANK=" + std::to_string(rank) + " ";
}

}  // namespace

// The cases: rank 0 of 2 started alone, rank 1 of 2 alone, and rank 1 pointed at an address
// where nobody listens. Each says at once what it waits for (on stderr), then a line per progress
// interval (0.5 s here, 10 s by default), and gives up after --rendezvous-timeout naming what never came.
TEST(TrainCliTcp, ARankAloneSaysWhatItWaitsForAndGivesUpAfterTheRendezvousTimeout) {
    Fixture f;
    const int port = free_port();
    const std::string p = std::to_string(port);
    const auto r0 = stderr_of(torchrun_env(0, 2, "127.0.0.1", port) + f.base_cmd("r0") + " --rendezvous-timeout=2");
    const std::string& o0 = r0.result.output;
    EXPECT_NE(r0.result.exit_code, 0) << o0;
    EXPECT_NE(r0.result.exit_code, 124) << "hung:\n" << o0;
    EXPECT_TRUE(Contains(o0, "rank 0 of 2: listening on 127.0.0.1:" + p +
                                 " (MASTER_ADDR:MASTER_PORT); waiting for rank 1 for up to 2 s (--rendezvous-timeout=2)"))
        << o0;
    EXPECT_TRUE(Contains(o0, "no rank joined; still waiting for rank 1 (gives up at 2 s)")) << o0;
    EXPECT_TRUE(Contains(o0, "for rank 1 of world 2, which never connected")) << o0;
    EXPECT_TRUE(Contains(o0, "the wait is bounded by --rendezvous-timeout=2")) << o0;
    EXPECT_LT(r0.seconds, 20) << o0;

    for (const std::string addr : {"127.0.0.1", "127.0.0.2"}) {
        SCOPED_TRACE(addr);
        const std::string target = "rank 0 at " + addr + ":" + p + " (MASTER_ADDR:MASTER_PORT)";
        const auto r1 = stderr_of(torchrun_env(1, 2, addr, port) + f.base_cmd("r1") + " --rendezvous-timeout=2");
        const std::string& o1 = r1.result.output;
        EXPECT_NE(r1.result.exit_code, 0) << o1;
        EXPECT_NE(r1.result.exit_code, 124) << "hung:\n" << o1;
        EXPECT_TRUE(Contains(o1, "rank 1 of 2: connecting to " + target + " for up to 2 s (--rendezvous-timeout=2)"))
            << o1;
        EXPECT_TRUE(Contains(o1, ": no answer from " + target + " yet (Connection refused); still trying")) << o1;
        EXPECT_TRUE(Contains(o1, "rank 1 of 2 could not connect to " + target + " within ")) << o1;
        EXPECT_LT(r1.seconds, 20) << o1;
    }
    EXPECT_FALSE(std::filesystem::exists(f.dir / "r0/log.jsonl"));
}

// --comm-timeout says how long a silent peer may stall the job: a missing one too.
TEST(TrainCliTcp, TheCommTimeoutCapsTheRendezvousTimeout) {
    Fixture f;
    const auto r = stderr_of(torchrun_env(0, 2, "127.0.0.1", free_port()) + f.base_cmd("cap") + " --comm-timeout=1");
    EXPECT_NE(r.result.exit_code, 0) << r.result.output;
    EXPECT_TRUE(Contains(r.result.output, "for up to 1 s (--comm-timeout=1, which caps --rendezvous-timeout=600)"))
        << r.result.output;
    EXPECT_TRUE(Contains(r.result.output, "the wait is bounded by --comm-timeout=1")) << r.result.output;
    EXPECT_LT(r.seconds, 15) << r.result.output;
}

// A MASTER_ADDR no resolver knows is a typo, not a host still booting: an error at once, not after
// the whole timeout (600 s by default).
TEST(TrainCliTcp, AMasterAddrThatDoesNotResolveIsAnErrorAtOnce) {
    addrinfo* ai = nullptr;
    const int rc = getaddrinfo("no-such-host.invalid", "80", nullptr, &ai);
    if (ai) freeaddrinfo(ai);
    if (rc == EAI_AGAIN) GTEST_SKIP() << "no resolver answers on this machine (EAI_AGAIN is retried, by design)";
    Fixture f;
    const auto r = stderr_of(torchrun_env(1, 2, "no-such-host.invalid", free_port()) + f.base_cmd("dns"));
    EXPECT_NE(r.result.exit_code, 0) << r.result.output;
    EXPECT_TRUE(Contains(r.result.output, "rank 0's address MASTER_ADDR=no-such-host.invalid does not resolve"))
        << r.result.output;
    EXPECT_LT(r.seconds, 15) << r.result.output;
}
