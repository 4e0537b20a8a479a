// A training run as a session that a driver steps (docs/design.md, "The rank loop"): the CLI's loop
// (run) and the Python package (qtrain.Trainer) drive the same calls. Opening it starts the run's
// local ranks — all of them in threads mode (one thread each, rank 0 on the calling thread), or this
// process's one rank when each rank is a process (mpirun, torchrun, Slurm) — and each builds its
// model and loads, initialises or resumes its state. Every call then runs on every local rank at
// once and returns rank 0's result (in process mode: this process's). A failure on any rank ends the
// session: the call throws the first failure, naming its rank, and every later call refuses.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "train/rank_session.h"
#include "train/run_context.h"

namespace qtrain {

class RankThreads;

class TrainingSession {
public:
    // `ctx` from make_run_context (not --plan-only). `host`: this process's communicator when each
    // rank is a process; null: threads mode, ctx.world ranks as threads of this process.
    explicit TrainingSession(RunContext ctx, comm::Communicator* host = nullptr);
    ~TrainingSession();
    TrainingSession(const TrainingSession&) = delete;
    TrainingSession& operator=(const TrainingSession&) = delete;

    const RunContext& context() const { return ctx_; }
    const ModelConfig& config() const { return ctx_.source.config; }
    int next_step() const { return next_step_; }

    // RankSession's calls, on every local rank. step() refuses, before any rank starts (the session
    // stays open), tokens of the wrong row count and an lr that is negative, inf or nan.
    StepReport step(const StepTokens* tokens = nullptr, std::optional<float> lr = std::nullopt);
    // RankSession::compute_gradients on every local rank (the tokens' row count checked first, as step's).
    void compute_gradients(const StepTokens& tokens);
    EvalResult evaluate();
    std::string save_checkpoint();
    void load_checkpoint(const std::string& dir);
    void export_model(const std::string& dir);
    int finish();
    std::vector<float> read_tensor(const std::string& name, IModel::TensorKind kind);

    // The CLI's loop: steps up to --steps, then finish(). Returns 0, or 130 after a stop signal (a
    // checkpoint written).
    int run();

private:
    // Runs fn on every local rank; its value on rank 0 (or this process's rank).
    template <class T>
    T on_ranks(const std::function<T(RankSession&)>& fn);
    void check_open() const;

    RunContext ctx_;
    comm::Communicator* host_;
    std::unique_ptr<RankThreads> threads_;  // threads mode
    std::vector<std::unique_ptr<RankSession>> ranks_;  // by rank (threads mode) or this process's one
    int next_step_ = 0;
    std::string failed_;  // the error that ended the session ("" = open)
    bool ended_ = false;  // this process's rank ended quietly (process mode, ranks > 0)
};

}  // namespace qtrain
