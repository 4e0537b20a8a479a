// Model resolution: local directory first, then the HF hub cache layout
// (<root>/models--org--name/snapshots/<rev>/, with refs/main naming the revision). The environment
// is pointed at temp directories so a real cache on the machine never leaks into the results.
#include "io/hf_model_dir.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "test_util.h"

namespace qtrain {
namespace {

using test::TempDir;
using test::write_file;
namespace fs = std::filesystem;

// Sets (or unsets, with nullptr) an environment variable for the lifetime of the object.
class ScopedEnv {
public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        if (value) ::setenv(name, value, 1);
        else ::unsetenv(name);
    }
    ~ScopedEnv() {
        if (old_) ::setenv(name_, old_->c_str(), 1);
        else ::unsetenv(name_);
    }

private:
    const char* name_;
    std::optional<std::string> old_;
};

class HfModelDir : public ::testing::Test {
protected:
    TempDir tmp;
    // Every cache root points into tmp (empty unless a test fills it).
    ScopedEnv hub{"HF_HUB_CACHE", (tmp.path / "hub").c_str()};
    ScopedEnv home_hf{"HF_HOME", (tmp.path / "hf_home").c_str()};
    ScopedEnv home{"HOME", (tmp.path / "home").c_str()};

    // Creates <root>/models--org--name/snapshots/<rev>/config.json; returns the snapshot dir.
    static fs::path make_snapshot(const fs::path& root, const std::string& repo, const std::string& rev) {
        fs::path snap = root / repo / "snapshots" / rev;
        fs::create_directories(snap);
        write_file((snap / "config.json").string(), "{}");
        return snap;
    }
};

TEST_F(HfModelDir, LocalDirectory) {
    fs::create_directories(tmp.path / "local");
    write_file(tmp.file("local/config.json"), "{}");
    EXPECT_EQ(find_model_dir(tmp.file("local")), tmp.file("local"));
    EXPECT_EQ(resolve_model_dir(tmp.file("local")), tmp.file("local"));
}

TEST_F(HfModelDir, LocalDirectoryWithoutConfigIsNotAModel) {
    fs::create_directories(tmp.path / "empty");
    EXPECT_EQ(find_model_dir(tmp.file("empty")), std::nullopt);
    EXPECT_ERROR(resolve_model_dir(tmp.file("empty")), tmp.file("empty"), "no config.json");
}

TEST_F(HfModelDir, HubCacheFollowsRefsMain) {
    const std::string repo = "models--Qwen--Qwen2.5-0.5B";
    const fs::path root = tmp.path / "hub";
    const fs::path wanted = make_snapshot(root, repo, "abc123");
    const fs::path other = make_snapshot(root, repo, "zzz999");
    fs::last_write_time(other, fs::last_write_time(wanted) + std::chrono::hours(1));  // newer, but not main
    fs::create_directories(root / repo / "refs");
    write_file((root / repo / "refs" / "main").string(), "abc123");
    EXPECT_EQ(find_model_dir("Qwen/Qwen2.5-0.5B"), wanted.string());
    // A trailing newline (hand-written ref) still works.
    write_file((root / repo / "refs" / "main").string(), "abc123\n");
    EXPECT_EQ(resolve_model_dir("Qwen/Qwen2.5-0.5B"), wanted.string());
    // refs/main naming a snapshot that is not there: fall back to the newest snapshot.
    write_file((root / repo / "refs" / "main").string(), "gone");
    EXPECT_EQ(find_model_dir("Qwen/Qwen2.5-0.5B"), other.string());
}

TEST_F(HfModelDir, HubCacheWithoutRefsTakesNewest) {
    const std::string repo = "models--org--m";
    const fs::path root = tmp.path / "hub";
    const fs::path older = make_snapshot(root, repo, "r1");
    const fs::path newer = make_snapshot(root, repo, "r2");
    fs::last_write_time(older, fs::last_write_time(newer) - std::chrono::hours(2));
    fs::create_directories(root / repo / "snapshots" / "r3");  // incomplete: no config.json
    fs::last_write_time(root / repo / "snapshots" / "r3", fs::last_write_time(newer) + std::chrono::hours(2));
    EXPECT_EQ(find_model_dir("org/m"), newer.string());
}

TEST_F(HfModelDir, HfHomeAndHomeFallbacks) {
    make_snapshot(tmp.path / "hf_home" / "hub", "models--a--b", "r");
    EXPECT_EQ(find_model_dir("a/b"), (tmp.path / "hf_home" / "hub" / "models--a--b" / "snapshots" / "r").string());
    make_snapshot(tmp.path / "home" / ".cache" / "huggingface" / "hub", "models--c--d", "r");
    EXPECT_NE(find_model_dir("c/d"), std::nullopt);
    // HF_HUB_CACHE wins over HF_HOME.
    const fs::path first = make_snapshot(tmp.path / "hub", "models--a--b", "s");
    EXPECT_EQ(find_model_dir("a/b"), first.string());
}

TEST_F(HfModelDir, MissingModelListsPlacesLooked) {
    EXPECT_EQ(find_model_dir("Nope/Missing"), std::nullopt);
    EXPECT_ERROR(resolve_model_dir("Nope/Missing"), "'Nope/Missing'", "local directory",
                 (tmp.path / "hub" / "models--Nope--Missing" / "snapshots").string(),
                 (tmp.path / "hf_home" / "hub" / "models--Nope--Missing" / "snapshots").string(),
                 (tmp.path / "home" / ".cache" / "huggingface" / "hub" / "models--Nope--Missing").string(),
                 "never downloads");
    // Not of the org/name shape: only the local directory was a candidate.
    EXPECT_EQ(find_model_dir("a/b/c"), std::nullopt);
    EXPECT_EQ(find_model_dir("plainname"), std::nullopt);
    std::string m = EXPECT_ERROR(resolve_model_dir("plainname"), "'plainname'");
    EXPECT_EQ(m.find("models--"), std::string::npos) << m;
}

}  // namespace
}  // namespace qtrain
