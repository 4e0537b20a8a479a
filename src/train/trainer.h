// The training loop: data -> micro-batches -> IModel -> optimizer step, with evaluation,
// checkpoints, resume and the final HF export. Device-agnostic: everything device-specific sits
// behind IModel (model_factory.h builds it).
#pragma once

#include <string>

#include "train/train_options.h"

namespace qtrain {

class Trainer {
public:
    explicit Trainer(TrainOptions options, std::string command_line = "");
    // Runs the whole job; returns the process exit code (0, or 130 after SIGINT/SIGTERM with a
    // checkpoint written). Throws qtrain::Error on bad input.
    int run();

private:
    TrainOptions opt_;
    std::string command_line_;
};

}  // namespace qtrain
