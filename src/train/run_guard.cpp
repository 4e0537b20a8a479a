#include "train/run_guard.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/lora.h"
#include "train/resume_check.h"
#include "train/train_options.h"

namespace qtrain {

namespace fs = std::filesystem;

void probe_writable_dir(const std::string& dir, const char* flag) {
    std::error_code ec;
    const fs::path target = fs::absolute(fs::path(dir.empty() ? "." : dir), ec);  // "" = the working directory
    fs::path p = target;
    while (!p.empty() && !fs::exists(p, ec)) p = p.parent_path();
    QT_CHECK(!p.empty(), flag, ": '", dir, "' cannot be created (no existing parent)");
    QT_CHECK(fs::is_directory(p, ec), flag, ": '", dir, "' cannot be created: '", p.string(), "' is not a directory");
    const fs::path probe = p / fmt::format(".qtrain-write-probe-{}", ::getpid());
    errno = 0;
    FILE* f = std::fopen(probe.c_str(), "wb");
    const bool ok = f && std::fputc('q', f) != EOF;
    const int err = errno;
    if (f) std::fclose(f);
    fs::remove(probe, ec);
    QT_CHECK(ok, flag, ": cannot write in '", p.string(), "'", p == target ? "" : cat(" (for '", dir, "')"),
             ": ", err ? std::strerror(err) : "unknown error");
}

namespace {

// Whether a JSONL log records any training: a step, an evaluation or a finished run. A log that
// stops at its set-up events (a run refused for its data, say) holds nothing to lose, and treating
// it as a run's output would refuse the corrected command that follows.
bool log_records_training(const std::string& path) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        if (line.find("\"log\":\"step\"") == std::string::npos && line.find("\"log\":\"eval\"") == std::string::npos &&
            line.find("\"log\":\"done\"") == std::string::npos)
            continue;
        const auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_object() && j.contains("log") && j["log"].is_string()) return true;
    }
    return false;
}

}  // namespace

std::vector<std::string> existing_run_output(const TrainOptions& o) {
    std::vector<std::string> found;
    std::error_code ec;
    if (fs::is_regular_file(o.log_path(), ec) && log_records_training(o.log_path())) found.push_back(o.log_path());
    // a model, or a LoRA run's PEFT adapter (model/lora.h)
    for (const char* file : {"model.safetensors", kAdapterWeightsFile}) {
        const std::string model = (fs::path(o.out_dir) / file).string();
        if (fs::is_regular_file(model, ec) && fs::file_size(model, ec) > 0) found.push_back(model);
    }
    return found;
}

bool log_is_of_this_run(const std::string& path, const TrainOptions& o, const std::string& device,
                        const ModelConfig& cfg) {
    std::ifstream in(path);
    std::string line, options, config;
    std::string recorded_device;
    for (int n = 0; n < 16 && std::getline(in, line) && (options.empty() || config.empty()); ++n) {
        const auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) return false;
        if (j.value("log", "") == "options" && j.contains("options")) options = j["options"].dump();
        if (j.value("log", "") == "system") recorded_device = j.value("device", "");
        if (j.value("log", "") == "model" && j.contains("config")) config = j["config"].dump();
    }
    if (options.empty() || config.empty()) return false;
    const auto changes = compare_resume_options(options, recorded_device, config, o, device, cfg);
    const auto recorded = nlohmann::json::parse(options);
    return recorded.value("checkpoint-dir", "") == o.checkpoint_dir &&
           std::none_of(changes.begin(), changes.end(), [](const OptionChange& c) { return c.changes_run; });
}

}  // namespace qtrain
