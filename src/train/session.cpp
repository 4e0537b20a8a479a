#include "train/session.h"

#include <cmath>
#include <exception>

#include "core/error.h"
#include "train/rank_threads.h"

namespace qtrain {

TrainingSession::TrainingSession(RunContext ctx, comm::Communicator* host) : ctx_(std::move(ctx)), host_(host) {
    QT_CHECK(!ctx_.options.plan_only, "internal: a training session was opened with --plan-only");
    if (host_) {
        ranks_.resize(1);
        ranks_[0] = std::make_unique<RankSession>(ctx_, *host_);
    } else {
        ranks_.resize(static_cast<std::size_t>(ctx_.world));
        threads_ = std::make_unique<RankThreads>(ctx_.world);
        try {
            threads_->run([this](int rank, comm::Communicator& comm) {
                ranks_[rank] = std::make_unique<RankSession>(ctx_, comm);
            });
        } catch (...) {
            // each rank's model is released on the thread that made it (its device is current there)
            threads_->run_quietly([this](int rank, comm::Communicator&) { ranks_[rank].reset(); });
            throw;
        }
    }
    next_step_ = ranks_[0]->next_step();
}

TrainingSession::~TrainingSession() {
    if (threads_) threads_->run_quietly([this](int rank, comm::Communicator&) { ranks_[rank].reset(); });
}

void TrainingSession::check_open() const {
    QT_CHECK(failed_.empty(), "the training session stopped after an error and cannot go on (start a new one; "
             "--continue resumes from its last checkpoint): ", failed_);
}

template <class T>
T TrainingSession::on_ranks(const std::function<T(RankSession&)>& fn) {
    check_open();
    std::optional<T> result;
    try {
        if (!threads_) {
            RankSession& r = *ranks_[0];
            try {
                result.emplace(fn(r));
            } catch (const std::exception& e) {
                r.abort(e.what());
                throw;
            }
        } else {
            threads_->run([&](int rank, comm::Communicator&) {
                RankSession& r = *ranks_[rank];
                try {
                    T value = fn(r);
                    if (rank == 0) result.emplace(std::move(value));
                } catch (const std::exception& e) {
                    r.abort(e.what());
                    throw;
                }
            });
        }
    } catch (const std::exception& e) {
        failed_ = e.what();
        throw;
    }
    next_step_ = ranks_[0]->next_step();
    return std::move(*result);
}

StepReport TrainingSession::step(const StepTokens* tokens, std::optional<float> lr) {
    QT_CHECK(!ended_, "the run has ended on this rank");
    // the caller's mistakes are refused here, before any rank starts: they leave the session open
    const TrainOptions& o = ctx_.options;
    QT_CHECK(tokens || !o.train_file.empty(), "no --train-file: give this step's tokens (inputs and targets)");
    const int64_t rows = static_cast<int64_t>(o.grad_accumulation) * ctx_.world * o.batch_size;
    QT_CHECK(!tokens || tokens->rows == rows, "a step's tokens must be --grad-accumulation x ranks x --batch-size = ",
             o.grad_accumulation, " x ", ctx_.world, " x ", o.batch_size, " = ", rows, " rows of --seq-len=",
             o.seq_len, " tokens, got ", tokens ? tokens->rows : 0, " rows");
    // a caller's learning rate (Python schedules; --learning-rate is checked as an option): a negative
    // one would train by gradient ascent, inf or nan ruin the weights (and the next step blame the flag)
    QT_CHECK(!lr || (std::isfinite(*lr) && *lr >= 0), "step(): lr must be a finite number >= 0 (as --learning-rate), got ",
             lr.value_or(0));
    StepReport r = on_ranks<StepReport>([&](RankSession& s) { return s.step(tokens, lr); });
    if (r.ended) ended_ = true;
    return r;
}

void TrainingSession::compute_gradients(const StepTokens& tokens) {
    QT_CHECK(!ended_, "the run has ended on this rank");
    const TrainOptions& o = ctx_.options;
    const int64_t rows = static_cast<int64_t>(o.grad_accumulation) * ctx_.world * o.batch_size;
    QT_CHECK(tokens.rows == rows, "compute_gradients(): the tokens must be --grad-accumulation x ranks x --batch-size = ",
             o.grad_accumulation, " x ", ctx_.world, " x ", o.batch_size, " = ", rows, " rows of --seq-len=", o.seq_len,
             " tokens, got ", tokens.rows, " rows");
    on_ranks<int>([&](RankSession& s) {
        s.compute_gradients(tokens);
        return 0;
    });
}

EvalResult TrainingSession::evaluate() {
    return on_ranks<EvalResult>([](RankSession& s) { return s.evaluate(); });
}

std::string TrainingSession::save_checkpoint() {
    return on_ranks<std::string>([](RankSession& s) { return s.save_checkpoint(); });
}

void TrainingSession::load_checkpoint(const std::string& dir) {
    on_ranks<int>([&](RankSession& s) {
        s.load_checkpoint(dir);
        return 0;
    });
}

void TrainingSession::export_model(const std::string& dir) {
    on_ranks<int>([&](RankSession& s) {
        s.export_model(dir);
        return 0;
    });
}

int TrainingSession::finish() {
    return on_ranks<int>([](RankSession& s) { return s.finish(); });
}

std::vector<float> TrainingSession::read_tensor(const std::string& name, IModel::TensorKind kind) {
    return on_ranks<std::vector<float>>([&](RankSession& s) { return s.read_tensor(name, kind); });
}

int TrainingSession::run() {
    while (next_step_ < ctx_.options.steps) {
        const StepReport r = step();
        if (r.ended) return 0;  // rank 0 reports why (process mode, this rank > 0)
        if (r.stop) return 130;
    }
    return finish();
}

}  // namespace qtrain
