#include "train/model_source.h"

#include <filesystem>

#include "core/error.h"
#include "io/hf_model_dir.h"
#include "train/train_options.h"

namespace qtrain {

namespace fs = std::filesystem;

ModelSource resolve_model_source(const TrainOptions& o) {
    ModelSource src;
    std::error_code ec;
    // a file is not looked up in the HF cache: --model=dir/config.json means dir
    if (fs::is_regular_file(o.model, ec)) {
        const fs::path parent = fs::path(o.model).parent_path();
        throw_error(cat("--model: '", o.model, "' is a file; --model takes the model's directory (with config.json and ",
                        "the weights in it)",
                        fs::path(o.model).filename() == "config.json" ? cat(": --model=", parent.empty() ? "." : parent.string())
                                                                      : std::string()));
    }
    if (auto dir = find_model_dir(o.model)) {
        const std::string cfg_path = (fs::path(*dir) / "config.json").string();
        QT_CHECK(fs::exists(cfg_path), "--model: '", *dir, "' has no config.json");
        QT_CHECK(fs::is_regular_file(cfg_path, ec), "--model: '", cfg_path, "' is ",
                 fs::is_directory(cfg_path, ec) ? "a directory" : "not a regular file",
                 ", not the model's config.json file (HF's JSON)");
        src.config = load_model_config(cfg_path);
        src.directory = *dir;
        src.description = *dir;
        return src;
    }
    if (has_preset(o.model)) {
        QT_CHECK(o.from_scratch, "--model=", o.model, " is a built-in preset (shape only, no weights) and is not in the local "
                 "HF cache: add --from-scratch to train it from random initialisation, or pass a directory with weights");
        src.config = preset_config(o.model);
        src.description = "preset " + o.model;
        return src;
    }
    (void)resolve_model_dir(o.model);  // throws with the list of places looked
    throw_error("unreachable");
}

}  // namespace qtrain
