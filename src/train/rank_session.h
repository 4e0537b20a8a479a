// One rank of a training run as a session: the same code on every rank, whether the run has one rank,
// N threads of this process (rank_threads.h) or N processes under mpirun / torchrun / Slurm
// (docs/design.md, "The rank loop"). Opening it builds the rank's model and data loader (its block of
// every micro-batch group, DataLoader::set_rank) and loads or initialises the state, or resumes with
// --continue; then the driver calls step, evaluate, save_checkpoint, load_checkpoint, export_model
// and finish in the same order on every rank. The ranks meet in the model's collectives (over the
// model communicator) and, over the host communicator, once per step (step_agreement.h), in the split
// evaluation (evaluation.h) and in collective checkpoints (checkpointer.h). Rank 0 also decides how
// the run starts (run_start.h), prints [T]/[V], writes the JSONL log, and writes the HF export and
// the tokenizer files. The CLI's loop (TrainingSession::run) and the Python package drive it alike.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/imodel.h"
#include "train/evaluation.h"
#include "train/run_context.h"

namespace qtrain {

// One optimizer step's tokens given by the caller instead of the data loader (the Python package's
// step(inputs, targets)): `rows` rows of seq_len tokens for the whole world — accumulation x ranks x
// batch rows, micro-batch m of rank r being rows [(m * ranks + r) * batch, +batch), the global order
// the data loader follows (DataLoader::set_rank), so a step equals one rank's with ranks x the
// accumulation. Targets < 0 carry no loss. With --document-masking=on a row's documents end after each
// EOS input token (the caller sets the targets at document ends to -1 where it wants no cross-document
// prediction).
struct StepTokens {
    const int32_t* inputs = nullptr;
    const int32_t* targets = nullptr;
    int64_t rows = 0;
};

struct StepReport {
    int step = 0;          // the step's index (0-based); step + 1 steps are complete
    float loss = 0, grad_norm = 0, lr = 0;
    double ms = 0;         // the step's wall time on this rank (micro-batches and update)
    int64_t tokens = 0;    // tokens of the step over all ranks
    bool applied = true;   // false: no update (the step had no unmasked target)
    bool evaluated = false;  // --eval-every-n-steps evaluated after it
    bool stop = false;     // a stop signal on some rank: every rank stops after this step (checkpoint written)
    bool ended = false;    // ranks > 0 only: the run ends here, rank 0 reports why (it throws)
};

class RankSession {
public:
    RankSession(const RunContext& ctx, comm::Communicator& host);
    ~RankSession();
    RankSession(const RankSession&) = delete;
    RankSession& operator=(const RankSession&) = delete;

    int next_step() const { return step_; }
    // One optimizer step on the next micro-batches of --train-file (or `tokens`) at the schedule's
    // learning rate (or `lr`), then the evaluation and checkpoint --eval-every-n-steps and
    // --ckpt-interval ask for, and on a stop signal a checkpoint. Throws (rank 0) when the step is broken.
    StepReport step(const StepTokens* tokens = nullptr, std::optional<float> lr = std::nullopt);
    // The gradients step(tokens) would accumulate before its update, left for read_tensor(Gradient)
    // (the Python package's compute_gradients): no update, no step counted, no log line, the data
    // loader untouched. The next step clears them first, so it trains as if this call never was
    // (except --lora-dropout's masks, which count every training pass). Backends without
    // IModel::zero_gradients refuse.
    void compute_gradients(const StepTokens& tokens);
    // --eval-file's evaluation now ([V] line and log); collective.
    EvalResult evaluate();
    // A checkpoint of the state after next_step() steps into --checkpoint-dir; returns its directory.
    std::string save_checkpoint();
    // The state of checkpoint directory `dir` (verified by rank 0 against its checksums and this
    // run's options first): weights, optimizer state, data position and step.
    void load_checkpoint(const std::string& dir);
    // The HF model (weights, config, tokenizer files) into `dir`; collective under ZeRO-3.
    void export_model(const std::string& dir);
    // The CLI's end of a run: the final evaluation unless the last step made one, the export to
    // --out-dir (when it fails, the state is kept in a checkpoint and the error says where) and the
    // done line. Returns 0.
    int finish();
    // IModel::read_tensor on this rank (collective under ZeRO-3).
    std::vector<float> read_tensor(const std::string& name, IModel::TensorKind kind);
    const ModelConfig& config() const { return ctx_.source.config; }
    // After a failure on this rank: the model communicator's peers must not wait for it.
    void abort(const std::string& why);

private:
    void start();
    // The step's micro-batches (--train-file's next ones, or `tokens`) through forward_backward;
    // returns this rank's count of valid targets.
    int64_t forward_backward_step(const StepTokens* tokens);
    int load_start_state();
    // --from-scratch's random init or --model's weights (also the frozen base of a LoRA resume).
    void load_base_weights();
    void export_files(const std::string& dir);
    void log_packing();
    std::string write_checkpoint_now(int completed_steps);
    [[noreturn]] void stop_at_broken_step(int step, float loss, float grad_norm, int64_t valid_targets);

    const RunContext& ctx_;
    const TrainOptions& o_;
    comm::Communicator& host_;
    const int rank_, world_;
    const bool lead_;  // rank 0: decides the start, logs, exports
    struct State;      // rank_session.cpp: logger, data, model, watchdog, schedule
    std::unique_ptr<State> s_;
    int step_ = 0;
    int evaluated_at_ = -1;  // the step count of the last evaluation (-1: none)
    bool gradients_pending_ = false;  // compute_gradients left gradients that the next step clears
};

}  // namespace qtrain
