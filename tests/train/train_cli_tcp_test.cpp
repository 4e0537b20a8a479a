// torchrun-style launch through `train` (issue 19, many nodes; here on loopback): two processes with
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set meet over the TCP communicator and train
// exactly as threads mode does with --gpus=2 (the same sums in the same order: the same bits); a rank
// that fails ends both with its error, within the timeout.
#include <gtest/gtest.h>

#include <chrono>
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
