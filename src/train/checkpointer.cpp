#include "train/checkpointer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "model/imodel.h"

namespace qtrain {

namespace fs = std::filesystem;
using json = nlohmann::json;

static constexpr const char* kFormat = "qtrain-checkpoint-1";

std::string checkpoint_step_dir(const std::string& root, int step) {
    return (fs::path(root) / fmt::format("step_{:08d}", step)).string();
}

std::vector<std::string> list_complete_checkpoints(const std::string& root) {
    std::error_code ec;
    std::vector<std::pair<long, std::string>> found;
    if (!fs::is_directory(root, ec)) return {};
    for (const auto& entry : fs::directory_iterator(root, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.size() != 13 || name.rfind("step_", 0) != 0) continue;
        if (name.find_first_not_of("0123456789", 5) != std::string::npos) continue;
        if (!fs::exists(entry.path() / "state.json", ec)) continue;
        found.emplace_back(std::stol(name.substr(5)), entry.path().string());
    }
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<std::string> dirs;
    for (auto& f : found) dirs.push_back(std::move(f.second));
    return dirs;
}

std::optional<std::string> find_latest_checkpoint(const std::string& root) {
    auto all = list_complete_checkpoints(root);
    if (all.empty()) return std::nullopt;
    return all.front();
}

static void fsync_dir(const fs::path& dir) {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) { ::fsync(fd); ::close(fd); }
}

std::string write_checkpoint(const std::string& root, const IModel& model, const CheckpointState& state) {
    const fs::path final_dir = checkpoint_step_dir(root, state.step);
    const fs::path tmp_dir = fs::path(root) / fmt::format(".tmp_step_{:08d}_{}", state.step, ::getpid());
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
    fs::create_directories(tmp_dir, ec);
    QT_CHECK(!ec, "--checkpoint-dir: cannot create '", tmp_dir.string(), "': ", ec.message());
    try {
        model.save_checkpoint(tmp_dir.string());
        json j;
        j["format"] = kFormat;
        j["step"] = state.step;
        j["train_data"] = {{"epoch", state.train_data.epoch}, {"position", state.train_data.position}};
        j["options"] = json::parse(state.options_json);
        j["config"] = json::parse(state.config_json);
        j["device"] = state.device;
        j["world_size"] = 1;
        write_text_file_atomic((tmp_dir / "state.json").string(), j.dump(2) + "\n");
        fsync_dir(tmp_dir);
        if (fs::exists(final_dir)) fs::remove_all(final_dir);
        fs::rename(tmp_dir, final_dir);
        fsync_dir(fs::path(root));
    } catch (...) {
        fs::remove_all(tmp_dir, ec);
        throw;
    }
    return final_dir.string();
}

CheckpointState read_checkpoint_state(const std::string& dir) {
    const std::string path = (fs::path(dir) / "state.json").string();
    json j;
    try {
        j = json::parse(read_text_file(path));
    } catch (const json::exception& e) {
        throw_error(cat(path, ": not a valid checkpoint state (", e.what(), ")"));
    }
    QT_CHECK(j.value("format", "") == kFormat, path, ": unknown checkpoint format '", j.value("format", ""),
             "' (expected ", kFormat, ")");
    CheckpointState s;
    try {
        s.step = j.at("step").get<int>();
        s.train_data.epoch = j.at("train_data").at("epoch").get<int64_t>();
        s.train_data.position = j.at("train_data").at("position").get<int64_t>();
        s.options_json = j.at("options").dump();
        s.config_json = j.at("config").dump();
        s.device = j.value("device", "");
    } catch (const json::exception& e) {
        throw_error(cat(path, ": missing or malformed field (", e.what(), ")"));
    }
    return s;
}

}  // namespace qtrain
