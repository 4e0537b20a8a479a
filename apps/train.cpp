// `train`: the command-line front end. Everything happens in qtrain::Trainer; this file only turns
// argv into TrainOptions and errors into a message and an exit code.
#include <cstdio>
#include <string>

#include "core/error.h"
#include "train/train_options.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
    qtrain::TrainOptions options;
    if (auto exit_code = qtrain::parse_train_options(argc, argv, options)) return *exit_code;
    std::string cmd;
    for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
    try {
        return qtrain::Trainer(options, cmd).run();
    } catch (const qtrain::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "internal error: %s\n", e.what());
        return 2;
    }
}
