#include "train/checkpointer.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <filesystem>
#include <memory>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "comm/thread_communicator.h"
#include "comm/thread_world.h"
#include "core/checksum.h"
#include "core/error.h"
#include "core/files.h"
#include "io/block_set.h"
#include "model/imodel.h"

namespace qtrain {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Adding "files" (the checksums) kept the format: older qtrain versions ignore the field, and
// checkpoints without it still load here (unverified).
static constexpr const char* kFormat = "qtrain-checkpoint-1";
static constexpr const char* kStateFile = "state.json";

namespace {

bool all_digits(const std::string& s, std::size_t from, std::size_t to) {
    if (from >= to || to > s.size()) return false;
    return std::all_of(s.begin() + from, s.begin() + to, [](char c) { return c >= '0' && c <= '9'; });
}

// "step_XXXXXXXX" (8 digits) → its step.
std::optional<long> step_of(const std::string& name) {
    if (name.size() != 13 || name.rfind("step_", 0) != 0 || !all_digits(name, 5, 13)) return std::nullopt;
    return std::stol(name.substr(5));
}

// ".tmp_step_XXXXXXXX_<pid>" → its pid; nothing else matches (no suffixes, no other prefixes).
std::optional<pid_t> partial_pid(const std::string& name) {
    static const std::string prefix = ".tmp_step_";
    const std::size_t us = prefix.size() + 8;
    if (name.rfind(prefix, 0) != 0 || name.size() <= us + 1 || name.size() > us + 11) return std::nullopt;
    if (!all_digits(name, prefix.size(), us) || name[us] != '_' || !all_digits(name, us + 1, name.size()))
        return std::nullopt;
    const long long pid = std::stoll(name.substr(us + 1));
    if (pid <= 0 || pid > INT_MAX) return std::nullopt;
    return static_cast<pid_t>(pid);
}

std::string partial_name(long step, pid_t pid) { return fmt::format(".tmp_step_{:08d}_{}", step, pid); }

// A real directory, not a symbolic link to one: cleaning up never follows links out of `root`.
bool is_real_directory(const fs::path& p) {
    std::error_code ec;
    return fs::symlink_status(p, ec).type() == fs::file_type::directory;
}

uint64_t bytes_under(const fs::path& dir) {
    uint64_t total = 0;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
        if (it->is_regular_file(ec)) total += it->file_size(ec);
    return total;
}

void fsync_dir(const fs::path& dir) {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) { ::fsync(fd); ::close(fd); }
}

json read_state_json(const std::string& dir) {
    const std::string path = (fs::path(dir) / kStateFile).string();
    json j;
    try {
        j = json::parse(read_text_file(path));
    } catch (const json::exception& e) {
        throw_error(cat(path, ": not a valid checkpoint state (", e.what(), ")"));
    }
    QT_CHECK(j.is_object() && j.value("format", "") == kFormat, path, ": unknown checkpoint format '",
             j.is_object() ? j.value("format", "") : "", "' (expected ", kFormat, ")");
    return j;
}

// Size and checksum of every file the model wrote into `dir` (paths relative to it, sorted).
json checksum_files(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(dir))
        if (e.is_regular_file()) names.push_back(fs::relative(e.path(), dir).generic_string());
    std::sort(names.begin(), names.end());
    json files = json::object();
    for (const std::string& name : names) {
        const FileChecksum c = checksum_file((dir / name).string());
        files[name] = {{"bytes", c.bytes}, {"xxh3_64", checksum_hex(c.xxh3)}};
    }
    return files;
}

}  // namespace

std::string checkpoint_step_dir(const std::string& root, int step) {
    return (fs::path(root) / fmt::format("step_{:08d}", step)).string();
}

namespace {

// step_XXXXXXXX directories under `root` (with a state.json only when `complete`), newest first.
std::vector<std::string> step_dirs(const std::string& root, bool complete) {
    std::vector<std::pair<long, std::string>> found;
    std::error_code ec;
    if (!fs::is_directory(root, ec)) return {};
    for (const auto& entry : fs::directory_iterator(root, ec)) {
        const auto step = step_of(entry.path().filename().string());
        if (!step || !fs::is_directory(entry.path(), ec)) continue;
        if (!complete || fs::exists(entry.path() / kStateFile, ec)) found.emplace_back(*step, entry.path().string());
    }
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<std::string> dirs;
    for (auto& f : found) dirs.push_back(std::move(f.second));
    return dirs;
}

}  // namespace

std::vector<std::string> list_complete_checkpoints(const std::string& root) { return step_dirs(root, true); }
std::vector<std::string> list_checkpoint_dirs(const std::string& root) { return step_dirs(root, false); }

std::optional<std::string> find_latest_checkpoint(const std::string& root) {
    std::vector<std::string> all = list_complete_checkpoints(root);
    if (all.empty()) return std::nullopt;
    return all.front();
}

std::string write_checkpoint(comm::Communicator& ranks, const std::string& root, const IModel& model,
                             const CheckpointState& state) {
    const bool lead = ranks.rank() == 0;
    const fs::path final_dir = checkpoint_step_dir(root, state.step);
    std::error_code ec;
    std::string tmp;
    if (lead) {
        const fs::path dir = fs::path(root) / partial_name(state.step, ::getpid());
        fs::remove_all(dir, ec);
        fs::create_directories(dir, ec);
        QT_CHECK(!ec, "--checkpoint-dir: cannot create '", dir.string(), "': ", ec.message());
        tmp = dir.string();
    }
    // one directory for all ranks, named by rank 0's pid (the ranks may be processes with their own)
    const fs::path tmp_dir = comm::broadcast_string(ranks, tmp);
    try {
        model.save_checkpoint(tmp_dir.string());
        ranks.barrier();  // every rank's part is written (and synced) before rank 0 hashes it
        if (lead) {
            json j;
            j["format"] = kFormat;
            j["step"] = state.step;
            j["train_data"] = {{"epoch", state.train_data.epoch}, {"position", state.train_data.position}};
            j["options"] = json::parse(state.options_json);
            j["config"] = json::parse(state.config_json);
            j["device"] = state.device;
            j["train_files"] = json::array();
            for (const auto& [file, tokens] : state.train_files)
                j["train_files"].push_back({{"file", file}, {"tokens", tokens}});
            j["world_size"] = ranks.world();
            // the manifest of a sharded checkpoint: its blocks' ranges and dtypes, read back from the
            // files the ranks wrote (io/block_set.h); a block set that does not tile the flat space
            // fails the checkpoint here rather than its resume
            if (const auto blocks = open_block_set(tmp_dir.string()))
                j["shards"] = json::parse(block_manifest_json(*blocks));
            // hashed after every rank has written its files, so the sums are of what is on disk
            j["files"] = checksum_files(tmp_dir);
            write_text_file_atomic((tmp_dir / kStateFile).string(), j.dump(2) + "\n");
            fsync_dir(tmp_dir);
            if (fs::exists(final_dir)) fs::remove_all(final_dir);
            fs::rename(tmp_dir, final_dir);
            fsync_dir(fs::path(root));
        }
        ranks.barrier();
    } catch (...) {
        if (lead) fs::remove_all(tmp_dir, ec);
        throw;
    }
    return final_dir.string();
}

std::string write_checkpoint(const std::string& root, const IModel& model, const CheckpointState& state) {
    comm::ThreadWorld one(1);
    const std::unique_ptr<comm::Communicator> alone = comm::make_thread_communicator(one, 0);
    return write_checkpoint(*alone, root, model, state);
}

CheckpointState read_checkpoint_state(const std::string& dir) {
    const json j = read_state_json(dir);
    CheckpointState s;
    try {
        s.step = j.at("step").get<int>();
        s.train_data.epoch = j.at("train_data").at("epoch").get<int64_t>();
        s.train_data.position = j.at("train_data").at("position").get<int64_t>();
        s.options_json = j.at("options").dump();
        s.config_json = j.at("config").dump();
        s.device = j.value("device", "");
        s.world_size = j.value("world_size", 1);
        if (j.contains("train_files"))
            for (const auto& f : j.at("train_files"))
                s.train_files.emplace_back(f.at("file").get<std::string>(), f.at("tokens").get<int64_t>());
    } catch (const json::exception& e) {
        throw_error(cat((fs::path(dir) / kStateFile).string(), ": missing or malformed field (", e.what(), ")"));
    }
    return s;
}

bool verify_checkpoint(const std::string& dir) {
    const json j = read_state_json(dir);
    if (!j.contains("files")) return false;
    const std::string state_path = (fs::path(dir) / kStateFile).string();
    struct Expected {
        std::string path;
        uint64_t bytes, xxh3;
    };
    std::vector<Expected> files;
    try {
        for (const auto& [name, f] : j.at("files").items())
            files.push_back({(fs::path(dir) / name).string(), f.at("bytes").get<uint64_t>(),
                             parse_checksum_hex(f.at("xxh3_64").get<std::string>(), state_path)});
    } catch (const json::exception& e) {
        throw_error(cat(state_path, ": malformed \"files\" (", e.what(), ")"));
    }
    for (const Expected& f : files) {
        std::error_code ec;
        const uint64_t size = fs::file_size(f.path, ec);
        QT_CHECK(!ec, f.path, ": missing from the checkpoint (", kStateFile, " lists it): ", ec.message());
        QT_CHECK(size == f.bytes, f.path, ": truncated or changed: ", size, " bytes, but ", f.bytes,
                 " were written (", kStateFile, ")");
    }
    for (const Expected& f : files) {
        const FileChecksum c = checksum_file(f.path);
        QT_CHECK(c.bytes == f.bytes && c.xxh3 == f.xxh3, f.path, ": corrupt: its XXH3-64 checksum is ",
                 checksum_hex(c.xxh3), " but ", checksum_hex(f.xxh3), " was recorded when it was written (",
                 kStateFile, ")");
    }
    return true;
}

ResumePoint find_resume_point(const std::string& root,
                              const std::function<void(const std::string& dir, const std::string& error)>& rejected) {
    const std::vector<std::string> dirs = list_checkpoint_dirs(root);
    QT_CHECK(!dirs.empty(), "--continue: no checkpoint in '", root, "'");
    ResumePoint r;
    std::string newest_error;
    for (const std::string& dir : dirs) {
        try {
            // rank 0 writes state.json last and renames the whole directory into place, so a step
            // directory without one lost it afterwards (deleted by hand, or a copy that left it out)
            QT_CHECK(fs::exists(fs::path(dir) / kStateFile), (fs::path(dir) / kStateFile).string(),
                     " is missing (deleted, or left out of a copy): without it the checkpoint's step, data position "
                     "and options are unknown");
            r.verified = verify_checkpoint(dir);
            r.state = read_checkpoint_state(dir);
            r.dir = dir;
            return r;
        } catch (const Error& e) {
            if (newest_error.empty()) newest_error = e.what();
            rejected(dir, e.what());
            ++r.skipped;
        }
    }
    throw_error(cat("--continue: none of the ", dirs.size(), " checkpoint(s) in '", root,
                    "' is usable (the newest: ", newest_error, "); remove or restore them, or start "
                    "without --continue"));
}

std::vector<RemovedDir> remove_partial_checkpoints(const std::string& root) {
    std::vector<RemovedDir> out;
    std::error_code ec;
    if (!fs::is_directory(root, ec)) return out;
    for (const auto& entry : fs::directory_iterator(root, ec)) {
        const auto pid = partial_pid(entry.path().filename().string());
        if (!pid || !is_real_directory(entry.path())) continue;
        // alive: kill() succeeds, or fails only for lack of permission (another user's process)
        if (*pid != ::getpid() && (::kill(*pid, 0) == 0 || errno == EPERM)) continue;
        RemovedDir r{entry.path().string(), bytes_under(entry.path()),
                     fmt::format("partial checkpoint left by process {}, which is no longer running", *pid), ""};
        std::error_code rm;
        fs::remove_all(entry.path(), rm);
        if (rm) r.error = rm.message();
        out.push_back(std::move(r));
    }
    return out;
}

std::vector<RemovedDir> prune_checkpoints(const std::string& root, int keep, const std::string& just_written) {
    std::vector<RemovedDir> out;
    if (keep <= 0) return out;
    const std::string written_name = fs::path(just_written).filename().string();
    int kept = 0;
    for (const std::string& dir : list_complete_checkpoints(root)) {
        const fs::path p(dir);
        if (p.filename() == written_name || kept < keep) {
            ++kept;
            continue;
        }
        if (!is_real_directory(p)) continue;
        RemovedDir r{dir, bytes_under(p), fmt::format("--ckpt-keep={} keeps only the newest {}", keep, keep), ""};
        // out of the list of checkpoints at once (rename is atomic), then removed at leisure
        const fs::path doomed = p.parent_path() / partial_name(*step_of(p.filename().string()), ::getpid());
        std::error_code ec;
        fs::remove_all(doomed, ec);
        fs::rename(p, doomed, ec);
        if (!ec) fs::remove_all(doomed, ec);
        if (ec) r.error = ec.message();
        out.push_back(std::move(r));
    }
    return out;
}

}  // namespace qtrain
