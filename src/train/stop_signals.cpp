#include "train/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace qtrain {
namespace {

std::atomic<int> g_stop_signal{0};
// Rank 0 of an mpirun job: what mpirun's own stop signal means, written once (built beforehand: the
// handler may only write it).
char g_note_int[1024], g_note_term[1024];
std::atomic<bool> g_mpirun_note{false}, g_note_said{false};

void build_note(char* out, std::size_t size, const char* sig, int world) {
    const std::string note =
        "qtrain: rank 0 of " + std::to_string(world) + ": " + sig +
        " from mpirun: it is ending the job, because it was sent a signal or because a rank ended (named "
        "above or below). OpenMPI's mpirun kills the ranks 1 s after passing a signal on, and exits 1 whatever "
        "they return, so a checkpoint that takes longer is lost. To stop with a checkpoint and exit 130, signal "
        "the ranks rather than mpirun: pkill -TERM -P <mpirun's pid>\n";
    std::snprintf(out, size, "%s", note.c_str());
}

// Async-signal-safe only: atomics, getppid, write.
extern "C" void on_stop_signal(int sig, siginfo_t* info, void*) {
    g_stop_signal.store(sig);
    if (!g_mpirun_note.load() || !info || info->si_pid != ::getppid() || g_note_said.exchange(true)) return;
    const char* note = sig == SIGINT ? g_note_int : g_note_term;
    (void)!::write(STDERR_FILENO, note, std::strlen(note));
}

struct sigaction g_old_int, g_old_term;

}  // namespace

StopSignals::StopSignals(int mpirun_rank, int world) {
    g_stop_signal.store(0);
    g_note_said.store(false);
    build_note(g_note_int, sizeof g_note_int, "SIGINT", world);
    build_note(g_note_term, sizeof g_note_term, "SIGTERM", world);
    g_mpirun_note.store(mpirun_rank == 0);
    struct sigaction sa {};
    sa.sa_sigaction = on_stop_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;  // as std::signal did: interrupted reads and writes resume
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &g_old_int);
    sigaction(SIGTERM, &sa, &g_old_term);
}

StopSignals::~StopSignals() {
    sigaction(SIGINT, &g_old_int, nullptr);
    sigaction(SIGTERM, &g_old_term, nullptr);
    g_mpirun_note.store(false);
}

std::atomic<int>* StopSignals::flag() { return &g_stop_signal; }

}  // namespace qtrain
