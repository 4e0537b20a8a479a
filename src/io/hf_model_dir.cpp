#include "io/hf_model_dir.h"

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"

namespace qtrain {

namespace fs = std::filesystem;

static std::vector<fs::path> hub_cache_roots() {
    std::vector<fs::path> roots;
    if (const char* c = std::getenv("HF_HUB_CACHE"); c && *c) roots.emplace_back(c);
    if (const char* h = std::getenv("HF_HOME"); h && *h) roots.emplace_back(fs::path(h) / "hub");
    if (const char* home = std::getenv("HOME"); home && *home)
        roots.emplace_back(fs::path(home) / ".cache" / "huggingface" / "hub");
    return roots;
}

// models--org--name/snapshots/<rev>: prefer the revision refs/main points at, else the newest.
static std::optional<fs::path> snapshot_in(const fs::path& repo) {
    fs::path snapshots = repo / "snapshots";
    std::error_code ec;
    if (!fs::is_directory(snapshots, ec)) return std::nullopt;
    std::ifstream ref(repo / "refs" / "main");
    std::string rev;
    if (ref) std::getline(ref, rev);
    // The hub writes the bare hash, but a hand-edited ref may end in whitespace or CRLF.
    while (!rev.empty() && std::isspace(static_cast<unsigned char>(rev.back()))) rev.pop_back();
    if (!rev.empty() && fs::exists(snapshots / rev / "config.json", ec)) return snapshots / rev;
    std::optional<fs::path> best;
    fs::file_time_type best_time{};
    for (const auto& entry : fs::directory_iterator(snapshots, ec)) {
        if (!fs::exists(entry.path() / "config.json", ec)) continue;
        auto t = fs::last_write_time(entry.path(), ec);
        if (!best || t > best_time) { best = entry.path(); best_time = t; }
    }
    return best;
}

// "org/name" -> "models--org--name" (the hub cache's folder name); empty when `model` has another shape.
static std::string hub_repo_folder(const std::string& model) {
    auto slash = model.find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == model.size() ||
        model.find('/', slash + 1) != std::string::npos)
        return "";
    return "models--" + model.substr(0, slash) + "--" + model.substr(slash + 1);
}

std::optional<std::string> find_model_dir(const std::string& model) {
    std::error_code ec;
    // A local directory counts only with a config.json in it: a stray folder named like "Qwen/x"
    // must not hide the cached model of that name.
    if (fs::is_directory(model, ec) && fs::exists(fs::path(model) / "config.json", ec)) return model;
    std::string repo = hub_repo_folder(model);
    if (repo.empty()) return std::nullopt;
    for (const auto& root : hub_cache_roots()) {
        if (auto snap = snapshot_in(root / repo)) return snap->string();
    }
    return std::nullopt;
}

std::string resolve_model_dir(const std::string& model) {
    if (auto dir = find_model_dir(model)) return *dir;
    std::error_code ec;
    std::string looked = "'" + model + "' (local directory" +
                         (fs::is_directory(model, ec) ? ": exists but has no config.json)" : ")");
    if (std::string repo = hub_repo_folder(model); !repo.empty()) {
        for (const auto& root : hub_cache_roots()) looked += ", " + (root / repo / "snapshots").string();
    }
    throw_error(cat("--model: cannot find model '", model, "'; looked in ", looked,
                    ". qtrain never downloads: pass a local directory with config.json, a model in the "
                    "local HF cache (e.g. from `huggingface-cli download`), or --from-scratch with a preset name"));
}

std::string resolve_tokenizer_path(const std::string& spec, const std::string& flag) {
    std::error_code ec;
    if (fs::exists(spec, ec)) return spec;
    if (auto dir = find_model_dir(spec)) return *dir;
    throw_error(cat(flag, ": '", spec,
                    "' is neither a file/directory nor a model in the local HF cache; pass the path of a "
                    "tokenizer.json, a qwen.tiktoken or a model directory"));
}

}  // namespace qtrain
