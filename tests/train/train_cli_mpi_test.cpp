// MPI mode through `train` (issue 18): `mpirun -np N train --device=cpu ...` runs one rank per
// process in the same rank loop as threads mode. N processes equal one rank with N x the accumulation
// (1e-6 in loss and norm, 1e-5 in the weights) and threads mode at the same N bit for bit; ZeRO-1,
// ZeRO-2 and ZeRO-3 are bit-identical; --continue resumes bit for bit; only rank 0 prints; a rank
// that fails or is killed ends the job with a non-zero exit instead of a hang. Skipped where the build
// has no MPI or no OpenMPI mpirun (tests/CMakeLists.txt defines QTRAIN_MPIEXEC). Every run is under a
// time limit.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "test_util.h"
#include "train/train_cli_fixture.h"

using namespace qtrain;
using namespace qtrain::test;
using namespace qtrain::test::train_cli;
namespace fs = std::filesystem;

namespace {

#ifdef QTRAIN_MPIEXEC
constexpr const char* kMpiexec = QTRAIN_MPIEXEC;
#else
constexpr const char* kMpiexec = nullptr;
#endif

#define SKIP_WITHOUT_MPIRUN() \
    if (!kMpiexec) GTEST_SKIP() << "no OpenMPI mpirun in this build (QTRAIN_WITH_MPI, scripts/setup.sh)"

// mpirun with np processes. One OpenMP thread each: the processes share CI's two cores, where
// OpenMP's spinning threads would fight each other; the CPU model's bits do not depend on it.
std::string mpirun(int np, const std::string& env = "") {
    return std::string(kMpiexec) + " --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 " + env +
           " -np " + std::to_string(np) + " ";
}
const std::string kLimit = "timeout 120 ";

int count(const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

}  // namespace

TEST(TrainCliMpi, RanksEqualOneRankWithTheirAccumulationAndThreadsModeExactly) {
    SKIP_WITHOUT_MPIRUN();
    Fixture f;
    const std::string common = " --steps=8 --eval-every-n-steps=4 --grad-clip=0.3";
    for (int np : {2, 3}) {
        SCOPED_TRACE("-np " + std::to_string(np));
        const std::string n = std::to_string(np), one = "one" + n, threads = "threads" + n, mpi = "mpi" + n;
        auto a = run_command(kLimit + f.base_cmd(one) + common + " --grad-accumulation=" + std::to_string(2 * np));
        auto t = run_command(kLimit + f.base_cmd(threads) + common + " --grad-accumulation=2 --gpus=" + n);
        auto m = run_command(kLimit + f.base_cmd(mpi, "cpu", mpirun(np)) + common + " --grad-accumulation=2");
        ASSERT_EQ(a.exit_code, 0) << a.output;
        ASSERT_EQ(t.exit_code, 0) << t.output;
        ASSERT_EQ(m.exit_code, 0) << m.output;
        // rank 0 alone speaks
        EXPECT_EQ(count(m.output, "[Setup] MPI mode: " + n + " CPU ranks"), 1) << m.output;
        EXPECT_EQ(count(m.output, "[T] step     0 "), 1) << m.output;

        const std::string la = f.dir / (one + "/log.jsonl"), lt = f.dir / (threads + "/log.jsonl"),
                          lm = f.dir / (mpi + "/log.jsonl");
        const auto loss_a = step_losses(la), loss_m = step_losses(lm);
        const auto norm_a = event_values(la, "step", "norm"), norm_m = event_values(lm, "step", "norm");
        ASSERT_EQ(loss_a.size(), 8u);
        ASSERT_EQ(loss_m.size(), 8u);
        ASSERT_EQ(norm_m.size(), 8u);
        for (int s = 0; s < 8; ++s) {
            EXPECT_NEAR(loss_m[s], loss_a[s], 1e-6 * std::abs(loss_a[s])) << "step " << s;
            EXPECT_NEAR(norm_m[s], norm_a[s], 1e-6 * std::abs(norm_a[s])) << "step " << s;
        }
        EXPECT_LE(relative_weight_difference(read_all_weights(f.dir / (one + "/model.safetensors")),
                                             read_all_weights(f.dir / (mpi + "/model.safetensors"))),
                  1e-5);
        // the same sums in the same order as threads mode: the same bits, evaluation included
        EXPECT_EQ(loss_m, step_losses(lt));
        EXPECT_EQ(norm_m, event_values(lt, "step", "norm"));
        EXPECT_EQ(event_values(lm, "eval", "loss"), event_values(lt, "eval", "loss"));
        EXPECT_EQ(event_values(lm, "eval", "loss").size(), 2u);
        EXPECT_EQ(read_file(f.dir / (mpi + "/model.safetensors")), read_file(f.dir / (threads + "/model.safetensors")));
    }
}

TEST(TrainCliMpi, ZeroLevelsOneAndTwoAreBitIdentical) {
    SKIP_WITHOUT_MPIRUN();
    Fixture f;
    const std::string common = " --steps=6 --eval-every-n-steps=0 --grad-accumulation=2";
    auto z1 = run_command(kLimit + f.base_cmd("z1", "cpu", mpirun(2)) + common + " --zero-level=1");
    auto z2 = run_command(kLimit + f.base_cmd("z2", "cpu", mpirun(2)) + common + " --zero-level=2");
    ASSERT_EQ(z1.exit_code, 0) << z1.output;
    ASSERT_EQ(z2.exit_code, 0) << z2.output;
    EXPECT_TRUE(Contains(z2.output, "ZeRO-2")) << z2.output;
    EXPECT_EQ(step_losses(f.dir / "z1/log.jsonl"), step_losses(f.dir / "z2/log.jsonl"));
    EXPECT_EQ(read_file(f.dir / "z1/model.safetensors"), read_file(f.dir / "z2/model.safetensors"));
}

// ZeRO-3 over MPI: the gathers are MPI broadcasts, the export and the checkpoints are gathered to
// rank 0's process; ZeRO-1's bits, 5 eval batches included (each round leaves a rank out at the end).
TEST(TrainCliMpi, ZeroThreeEqualsZeroOneBitForBit) {
    SKIP_WITHOUT_MPIRUN();
    Fixture f;
    const std::string common =
        " --steps=4 --eval-every-n-steps=2 --eval-num-steps=5 --grad-accumulation=2 --ckpt-interval=4";
    for (int np : {2, 3}) {
        SCOPED_TRACE("-np " + std::to_string(np));
        const std::string n = std::to_string(np), z1 = "z1-" + n, z3 = "z3-" + n;
        auto a = run_command(kLimit + f.base_cmd(z1, "cpu", mpirun(np)) + common + " --zero-level=1");
        auto b = run_command(kLimit + f.base_cmd(z3, "cpu", mpirun(np)) + common + " --zero-level=3");
        ASSERT_EQ(a.exit_code, 0) << a.output;
        ASSERT_EQ(b.exit_code, 0) << b.output;
        EXPECT_TRUE(Contains(b.output, "MPI mode: " + n + " CPU ranks, ZeRO-3")) << b.output;
        const std::string la = f.dir / (z1 + "/log.jsonl"), lb = f.dir / (z3 + "/log.jsonl");
        ASSERT_EQ(step_losses(la).size(), 4u);
        EXPECT_EQ(step_losses(lb), step_losses(la));
        EXPECT_EQ(event_values(lb, "step", "norm"), event_values(la, "step", "norm"));
        ASSERT_EQ(event_values(la, "eval", "loss").size(), 2u);
        EXPECT_EQ(event_values(lb, "eval", "loss"), event_values(la, "eval", "loss"));
        EXPECT_EQ(read_file(f.dir / (z3 + "/model.safetensors")), read_file(f.dir / (z1 + "/model.safetensors")));
        for (const char* file : {"model.safetensors", "optimizer.safetensors"})
            EXPECT_EQ(read_file(f.dir / (z3 + "-ckpt/step_00000004/" + file)),
                      read_file(f.dir / (z1 + "-ckpt/step_00000004/" + file)))
                << file;
    }
}

TEST(TrainCliMpi, ContinueReproducesTheUninterruptedRunExactly) {
    SKIP_WITHOUT_MPIRUN();
    Fixture f;
    expect_continue_reproduces_full_run(f, "cpu", " --grad-accumulation=1", kLimit + mpirun(2));
    // its checkpoints were written by 2 processes of one micro-batch each: 3 would change the step
    auto other = run_command(kLimit + f.base_cmd("part", "cpu", mpirun(3)) +
                             " --steps=14 --eval-every-n-steps=0 --grad-accumulation=1 --ckpt-interval=5 --continue");
    EXPECT_NE(other.exit_code, 0) << other.output;
    EXPECT_TRUE(Contains(other.output, "a step would take 3 micro-batches (accumulation x ranks) instead of 2"))
        << other.output;
    EXPECT_FALSE(Contains(other.output, "[T] step")) << other.output;
}

TEST(TrainCliMpi, GpusMustBeOneOrTheNumberOfProcesses) {
    SKIP_WITHOUT_MPIRUN();
    Fixture f;
    auto r = run_command(kLimit + f.base_cmd("gpus", "cpu", mpirun(2)) + " --steps=1 --gpus=3");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << r.output;
    EXPECT_TRUE(Contains(r.output, "--gpus=3 but mpirun started 2 processes (-np 2)")) << r.output;
    EXPECT_FALSE(Contains(r.output, "[T] step")) << r.output;
    auto same = run_command(kLimit + f.base_cmd("gpus2", "cpu", mpirun(2)) + " --steps=1 --gpus=2");
    EXPECT_EQ(same.exit_code, 0) << same.output;
}

// QTRAIN_TEST_FAIL_RANK=r:s makes rank r throw at step s: it prints its error, named, and MPI_Abort
// ends every process (without it the others would wait in the step's collectives forever).
TEST(TrainCliMpi, AFailingRankEndsTheJobWithItsError) {
    SKIP_WITHOUT_MPIRUN();
    Fixture f;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = run_command(kLimit + f.base_cmd("fail", "cpu", mpirun(3, "-x QTRAIN_TEST_FAIL_RANK=2:3")) +
                         " --steps=8 --eval-every-n-steps=0");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "the job hung:\n" << r.output;
    EXPECT_TRUE(Contains(r.output, "qtrain: rank 2 of 3 failed: deliberate failure at step 3 (QTRAIN_TEST_FAIL_RANK=2:3"))
        << r.output;
    EXPECT_LT(seconds, 30.0) << r.output;
    // rank 0 logged steps 0 and 1 before it could meet rank 2 in step 2's agreement; MPI_Abort may
    // kill it before or after it logs step 2, but it never gets past step 3's
    const size_t logged = step_losses(f.dir / "fail/log.jsonl").size();
    EXPECT_GE(logged, 2u);
    EXPECT_LE(logged, 3u);
}

namespace {

// The pid of the child of `parent` that is MPI rank `rank` (mpirun starts the local ranks itself).
pid_t child_rank(pid_t parent, int rank) {
    for (const auto& e : fs::directory_iterator("/proc")) {
        const std::string name = e.path().filename();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        std::ifstream stat(e.path() / "stat");
        std::string line;
        if (!std::getline(stat, line)) continue;
        const size_t close = line.rfind(')');  // the command name may hold spaces
        if (close == std::string::npos) continue;
        std::istringstream rest(line.substr(close + 2));
        char state;
        pid_t ppid = 0;
        rest >> state >> ppid;
        if (ppid != parent) continue;
        std::ifstream env(e.path() / "environ");
        const std::string vars((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
        if (vars.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(rank) + '\0') != std::string::npos)
            return static_cast<pid_t>(std::stol(name));
    }
    return -1;
}

// An mpirun job in the background, in its own process group (so a hung one can be killed whole),
// its output in a file; ready once rank 0 has logged a few steps.
class Job {
public:
    Job(const std::string& cmd, std::string out, std::string log) : out_(std::move(out)), log_(std::move(log)) {
        pid_ = ::fork();
        if (pid_ == 0) {
            ::setpgid(0, 0);
            const int fd = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            ::dup2(fd, 1);
            ::dup2(fd, 2);
            ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
            ::_exit(127);
        }
    }
    ~Job() {
        if (pid_ > 0 && !ended_) {
            ::kill(-pid_, SIGKILL);
            ::waitpid(pid_, &status_, 0);
        }
    }
    pid_t pid() const { return pid_; }  // mpirun's (the shell execs it)
    std::string output() const { return read_file(out_); }
    int status() const { return status_; }
    // Whether rank 0 logged `steps` steps within 60 s (false too if the job ended before).
    bool training(size_t steps = 3) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (std::chrono::steady_clock::now() < deadline) {
            if (fs::exists(log_) && step_losses(log_).size() >= steps) return true;
            if (ended(0)) return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return false;
    }
    // Whether the job ended within `seconds`.
    bool ended(double seconds) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        do {
            if (ended_ || ::waitpid(pid_, &status_, WNOHANG) == pid_) return ended_ = true;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        } while (std::chrono::steady_clock::now() < deadline);
        return false;
    }

private:
    std::string out_, log_;
    pid_t pid_ = -1;
    int status_ = 0;
    bool ended_ = false;
};

}  // namespace

// A rank that dies without a word (SIGKILL, the OOM killer) mid-run: mpirun must notice and end the
// job, exiting non-zero, instead of leaving rank 0 waiting in a collective; rank 0 names the lost rank
// in qtrain's words (issue 29) beside OpenMPI's own reports.
TEST(TrainCliMpi, AKilledRankEndsTheJob) {
    SKIP_WITHOUT_MPIRUN();
    Fixture f;
    Job job(mpirun(2) + f.base_cmd("killed") + " --steps=1000000 --eval-every-n-steps=0", f.dir / "killed.out",
            f.dir / "killed/log.jsonl");
    ASSERT_TRUE(job.training()) << "no training steps within 60 s:\n" << job.output();
    const pid_t rank1 = child_rank(job.pid(), 1);
    ASSERT_GT(rank1, 0) << "rank 1 is not a child of mpirun (" << job.pid() << ")";
    ASSERT_EQ(::kill(rank1, SIGKILL), 0) << "could not kill rank 1 (pid " << rank1 << ")";
    ASSERT_TRUE(job.ended(30)) << "mpirun did not end within 30 s of rank 1's death (a hang):\n" << job.output();
    const std::string out = job.output();
    EXPECT_FALSE(WIFEXITED(job.status()) && WEXITSTATUS(job.status()) == 0) << out;
    EXPECT_TRUE(Contains(out, "signal 9")) << out;
    EXPECT_TRUE(Contains(out, "qtrain: rank 0 of 2: rank 1 (pid " + std::to_string(rank1) +
                                  " on this host) has ended while the job runs; unless it printed an error of its own"))
        << out;
}

// SIGTERM to the ranks (not to mpirun): every rank stops after the step, the checkpoint is written and
// the job exits 130, as in the other launch modes.
TEST(TrainCliMpi, SigtermToTheRanksCheckpointsAndExits130) {
    SKIP_WITHOUT_MPIRUN();
    Fixture f;
    Job job(mpirun(2) + f.base_cmd("stop") + " --steps=1000000 --eval-every-n-steps=0", f.dir / "stop.out",
            f.dir / "stop/log.jsonl");
    ASSERT_TRUE(job.training()) << job.output();
    for (int r = 0; r < 2; ++r) {
        const pid_t pid = child_rank(job.pid(), r);
        ASSERT_GT(pid, 0) << "rank " << r;
        ::kill(pid, SIGTERM);
    }
    ASSERT_TRUE(job.ended(60)) << job.output();
    const std::string out = job.output();
    EXPECT_TRUE(WIFEXITED(job.status()) && WEXITSTATUS(job.status()) == 130) << out;
    EXPECT_TRUE(Contains(out, "Stopping on signal 15")) << out;
    EXPECT_FALSE(Contains(out, "from mpirun")) << out;
    bool checkpoint = false;
    for (const auto& e : fs::directory_iterator(f.dir / "stop-ckpt"))
        checkpoint |= e.path().filename().string().rfind("step_", 0) == 0;
    EXPECT_TRUE(checkpoint) << out;
}

// SIGTERM to mpirun: OpenMPI's mpirun passes it on, kills the ranks 1 s later and exits 1 whatever
// they return (its own rule, which qtrain cannot change): rank 0 says so at once and how to stop with
// a checkpoint instead.
TEST(TrainCliMpi, SigtermToMpirunSaysWhatMpirunDoes) {
    SKIP_WITHOUT_MPIRUN();
    Fixture f;
    Job job(mpirun(2) + f.base_cmd("term") + " --steps=1000000 --eval-every-n-steps=0", f.dir / "term.out",
            f.dir / "term/log.jsonl");
    ASSERT_TRUE(job.training()) << job.output();
    ::kill(job.pid(), SIGTERM);
    ASSERT_TRUE(job.ended(60)) << job.output();
    const std::string out = job.output();
    EXPECT_TRUE(Contains(out, "qtrain: rank 0 of 2: SIGTERM from mpirun: it is ending the job")) << out;
    EXPECT_TRUE(Contains(out, "signal the ranks rather than mpirun: pkill -TERM -P <mpirun's pid>")) << out;
    EXPECT_EQ(count(out, "from mpirun"), 1) << "rank 0 alone says it:\n" << out;
}
