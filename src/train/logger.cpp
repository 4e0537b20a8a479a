#include "train/logger.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <filesystem>

#include <fmt/chrono.h>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "train/data_loader.h"
#include "train/resume_check.h"
#include "train/train_options.h"

namespace qtrain {

using json = nlohmann::json;

namespace {

std::string now_iso() {
    auto now = std::chrono::system_clock::now();
    return fmt::format("{:%Y-%m-%dT%H:%M:%S}", std::chrono::floor<std::chrono::seconds>(now));
}

json event(const char* kind, int step) {
    json j;
    j["log"] = kind;
    j["time"] = now_iso();
    j["step"] = step;
    return j;
}

std::string fmt_tokens(int64_t n) {
    if (n < 1'000'000) return fmt::format("{}k", n / 1000);
    if (n < 1'000'000'000) return fmt::format("{:.1f}M", n / 1e6);
    return fmt::format("{:.2f}B", n / 1e9);
}

std::string fmt_tps(int64_t tokens, double ms) {
    if (ms <= 0) return "    -";
    double tps = 1000.0 * static_cast<double>(tokens) / ms;
    if (tps < 100000) return fmt::format("{:5.0f}", tps);
    return fmt::format("{:4.0f}k", tps / 1000);
}

std::string fmt_time(double ms) {
    if (ms >= 100000) return fmt::format("{:5.0f}  s", ms / 1000);
    return fmt::format("{:5.0f} ms", ms);
}

double epoch_fraction_percent(double epoch) {
    double ip;
    return 100.0 * std::modf(epoch, &ip);
}

}  // namespace

Logger::Logger(const std::string& path, bool append) : path_(path) {
    std::filesystem::path p(path);
    std::error_code ec;
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
    QT_CHECK(!ec, "--log-file: cannot create the directory of '", path, "': ", ec.message());
    file_ = std::fopen(path.c_str(), append ? "a" : "w");
    QT_CHECK(file_, "--log-file: cannot open '", path, "' for writing: ", std::strerror(errno));
}

Logger::~Logger() {
    if (file_) std::fclose(file_);
}

// A log that silently stays empty (a full disk) is worse than a stopped run: every failed write is
// an error.
void Logger::write_line(const std::string& line) {
    errno = 0;
    const bool ok = std::fputs(line.c_str(), file_) >= 0 && std::fputc('\n', file_) != EOF && std::fflush(file_) == 0;
    QT_CHECK(ok, "--log-file: writing '", path_, "' failed: ", errno ? std::strerror(errno) : "unknown error",
             " (disk full?)");
    if (listener_) listener_(line);
}

void Logger::message(const std::string& text) {
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
}

void Logger::log_options(const TrainOptions& options, const std::string& command_line) {
    json j = event("options", 0);
    j["options"] = json::parse(options.to_json());
    j["cmd"] = command_line;
    write_line(j.dump());
}

void Logger::log_system(const std::string& device, const std::string& description, double peak_flops) {
    json j = event("system", 0);
    j["device"] = device;
    j["description"] = description;
    j["peak_flops"] = peak_flops;
    write_line(j.dump());
    std::printf("[System]\n  %s\n\n", description.c_str());
}

void Logger::log_model(const std::string& source, int64_t parameters, const std::string& config_json) {
    json j = event("model", 0);
    j["source"] = source;
    j["parameters"] = parameters;
    j["config"] = json::parse(config_json);
    write_line(j.dump());
    std::printf("[Model]\n  %s, %.1fM parameters\n\n", source.c_str(), static_cast<double>(parameters) / 1e6);
}

void Logger::log_dataset(const char* split, const DataLoader& loader) {
    json j = event("dataset", 0);
    j["split"] = split;
    j["tokens"] = loader.num_tokens();
    j["chunks"] = loader.num_chunks();  // rows, when packed
    if (loader.packed()) {  // --document-masking
        const PackStats& p = loader.pack_stats();
        j["packed"] = {{"documents", p.documents}, {"split_documents", p.split_documents}, {"rows", p.rows},
                       {"document_tokens", p.document_tokens}, {"trained_targets", p.trained_targets}};
    }
    json files = json::array();
    for (const auto& f : loader.files()) files.push_back({{"file", f->path()}, {"tokens", f->size()}});
    j["files"] = files;
    write_line(j.dump());
    std::printf("[Dataset %s] %s tokens in %zu file(s)\n", split, fmt_tokens(loader.num_tokens()).c_str(),
                loader.files().size());
    for (std::size_t i = 0; i < loader.files().size() && i < 10; ++i)
        std::printf("  %s : %lld\n", loader.files()[i]->path().c_str(), static_cast<long long>(loader.files()[i]->size()));
    if (loader.files().size() > 10) std::printf("  ... and %zu more\n", loader.files().size() - 10);
    std::printf("\n");
}

void Logger::log_memory(const MemoryPlan& plan, uint64_t limit_bytes) {
    json j = event("allocator", 0);
    json stats = json::array();
    for (const auto& e : plan.entries)
        stats.push_back({{"name", e.category}, {"device", e.device_bytes}, {"pinned", e.pinned_bytes}});
    j["device"] = plan.device;
    j["stats"] = stats;
    j["limit"] = limit_bytes;
    write_line(j.dump());

    const bool cpu = plan.device == "cpu";
    std::printf("[Allocator State] (%s)\n", plan.device.c_str());
    std::printf("  %16s %10s %10s\n", "in MiB", cpu ? "Host" : "Device", "Pinned");
    for (const auto& e : plan.entries)
        std::printf("  %16s %10.0f %10.0f\n", e.category.c_str(), e.device_bytes / 1048576.0, e.pinned_bytes / 1048576.0);
    std::printf("  %16s %10.0f %10.0f\n", "Total", plan.total_device() / 1048576.0, plan.total_pinned() / 1048576.0);
    if (limit_bytes) {
        std::printf("  %16s %10.0f\n", "Limit", limit_bytes / 1048576.0);
        std::printf("  %16s %10.0f\n", "Free", (static_cast<double>(limit_bytes) - plan.total_device()) / 1048576.0);
    }
    std::printf("\n");
    std::fflush(stdout);
}

void Logger::log_sol(double flops_per_token, double peak_flops) {
    flops_per_token_ = flops_per_token;
    peak_flops_ = peak_flops;
    json j = event("sol", 0);
    j["flops_per_token"] = flops_per_token;
    j["peak_flops"] = peak_flops;
    j["tps"] = peak_flops > 0 ? peak_flops / flops_per_token : 0.0;
    write_line(j.dump());
    std::printf("[Speed of Light]\n  %.2f GFLOP/token, peak %.1f TFLOP/s -> %.0f tokens/s\n\n", flops_per_token / 1e9,
                peak_flops / 1e12, peak_flops > 0 ? peak_flops / flops_per_token : 0.0);
}

void Logger::log_step(int step, double epoch, int64_t tokens, double ms, float norm, float loss, float lr) {
    train_loss_sum_ += loss;
    ++train_loss_count_;
    std::string sol;
    if (peak_flops_ > 0 && ms > 0) {
        double ideal_ms = 1000.0 * flops_per_token_ * static_cast<double>(tokens) / peak_flops_;
        sol = fmt::format(" | sol {:.1f}%", 100.0 * ideal_ms / ms);
    }
    std::printf("[T] step %5d [%5.1f%%] | time: %s | norm %10f | loss %10f | tps %s%s\n", step,
                epoch_fraction_percent(epoch), fmt_time(ms).c_str(), norm, loss, fmt_tps(tokens, ms).c_str(),
                sol.c_str());
    std::fflush(stdout);
    json j = event("step", step);
    j["epoch"] = epoch;
    j["step_tokens"] = tokens;
    j["duration_ms"] = ms;
    j["norm"] = norm;
    j["loss"] = loss;
    j["lr"] = lr;
    write_line(j.dump());
}

void Logger::log_eval(int step, double epoch, int64_t tokens, double ms, float loss) {
    float train_avg = train_loss_count_ ? static_cast<float>(train_loss_sum_ / train_loss_count_) : NAN;
    // eval: the summed token loss / trained tokens of the whole eval pass (evaluation.h)
    std::printf("[V] step %5d [%5.1f%%] | time: %s | eval %10f | train %9f | tps %s\n", step,
                epoch_fraction_percent(epoch), fmt_time(ms).c_str(), loss, train_avg, fmt_tps(tokens, ms).c_str());
    std::fflush(stdout);
    train_loss_sum_ = 0;
    train_loss_count_ = 0;
    json j = event("eval", step);
    j["epoch"] = epoch;
    j["eval_tokens"] = tokens;
    j["duration_ms"] = ms;
    j["loss"] = loss;
    j["loss_is"] = "summed token loss / trained tokens of the whole eval pass";
    write_line(j.dump());
}

void Logger::log_checkpoint(int step, const std::string& path, double ms) {
    std::printf("[C] step %5d | checkpoint %s (%.0f ms)\n", step, path.c_str(), ms);
    std::fflush(stdout);
    json j = event("checkpoint", step);
    j["path"] = path;
    j["duration_ms"] = ms;
    write_line(j.dump());
}

void Logger::log_resume(int step, const std::string& path, int skipped, bool verified) {
    if (!verified)
        std::printf("[Resume] note: %s has no checksums (written by an older qtrain): its files are loaded "
                    "unverified\n", path.c_str());
    if (skipped)
        std::printf("[Resume] from %s at step %d: the previous complete checkpoint (%d newer one%s unusable, "
                    "see above, and replaced when this run writes a checkpoint of %s step)\n\n",
                    path.c_str(), step, skipped, skipped == 1 ? " is" : "s are", skipped == 1 ? "its" : "their");
    else
        std::printf("[Resume] from %s at step %d\n\n", path.c_str(), step);
    std::fflush(stdout);
    json j = event("resume", step);
    j["path"] = path;
    j["skipped"] = skipped;
    j["verified"] = verified;
    write_line(j.dump());
}

void Logger::log_checkpoint_rejected(const std::string& path, const std::string& error, bool print) {
    if (print) {
        std::printf("[Resume] cannot resume from %s: %s\n", path.c_str(), error.c_str());
        std::fflush(stdout);
    }
    json j = event("checkpoint_rejected", 0);
    j["path"] = path;
    j["error"] = error;
    write_line(j.dump());
}

void Logger::log_checkpoint_removed(int step, const std::string& path, uint64_t bytes, const std::string& reason,
                                    const std::string& error) {
    if (error.empty())
        std::printf("[C] removed %s (%s): %s\n", path.c_str(), human_bytes(bytes).c_str(), reason.c_str());
    else
        std::printf("[C] warning: could not remove %s (%s): %s\n", path.c_str(), reason.c_str(), error.c_str());
    std::fflush(stdout);
    json j = event("checkpoint_removed", step);
    j["path"] = path;
    j["bytes"] = bytes;
    j["reason"] = reason;
    if (!error.empty()) j["error"] = error;
    write_line(j.dump());
}

void Logger::log_option_changes(const std::vector<OptionChange>& changes) {
    if (changes.empty()) return;
    json j = event("resume_changes", 0);
    json list = json::array();
    for (const auto& c : changes)
        list.push_back({{"flag", c.flag}, {"before", c.before}, {"after", c.after}, {"changes_run", c.changes_run}});
    j["changes"] = list;
    write_line(j.dump());
}

void Logger::log_stopped(int step, const std::string& reason) {
    json j = event("stopped", step);
    j["reason"] = reason;
    write_line(j.dump());
}

void Logger::log_done(int step, const std::string& out_dir, double seconds, const std::string& written) {
    std::printf("\nDone: %d steps in %.1f s; %s written to %s/%s\n", step, seconds,
                written == "model.safetensors" ? "model" : "adapter", out_dir.c_str(), written.c_str());
    std::fflush(stdout);
    json j = event("done", step);
    j["out_dir"] = out_dir;
    j["seconds"] = seconds;
    write_line(j.dump());
}

}  // namespace qtrain
