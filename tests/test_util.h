// Shared helpers for every test suite: temporary directories, whole-file reads and writes, expected
// qtrain::Error checks, substring checks, running apps, seeded random data.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace qtrain::test {

// A fresh, empty directory under the system temp dir, removed (with its contents) when the object
// dies. The name holds the process id, a per-process counter and a random number, so tests running
// in parallel (ctest -j runs one process per test) never share a directory.
class TempDir {
public:
    std::filesystem::path path;

    TempDir() {
        static std::atomic<unsigned> counter{0};
        std::random_device rd;
        const std::filesystem::path base = std::filesystem::temp_directory_path();
        do {
            path = base / ("qtrain-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
                           std::to_string(rd()));
        } while (!std::filesystem::create_directory(path));  // false: it exists already, draw again
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    std::string str() const { return path.string(); }
    // The path of `name` inside the directory, as a string (name may contain '/').
    std::string file(const std::string& name) const { return (path / name).string(); }
    std::string operator/(const std::string& name) const { return file(name); }
    // Number of entries directly in the directory (to see that no temp file was left behind).
    int count() const {
        int n = 0;
        for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path)) ++n;
        return n;
    }
};

// The whole file, byte for byte ("" if it cannot be read).
inline std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// Creates or truncates `path` and writes `bytes` to it exactly (embedded NULs included).
inline void write_file(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline ::testing::AssertionResult Contains(const std::string& haystack, const std::string& needle) {
    if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "expected to find \"" << needle << "\" in:\n" << haystack;
}

// Runs `f`, expecting a qtrain::Error whose message contains every one of `parts`; returns the
// message ("" when nothing or something else was thrown). Failures are reported at file:line.
// Use through EXPECT_ERROR.
template <class F>
std::string expect_error(F&& f, std::initializer_list<std::string> parts, const char* file, int line) {
    try {
        f();
    } catch (const Error& e) {
        const std::string m = e.what();
        for (const auto& p : parts)
            if (m.find(p) == std::string::npos)
                ADD_FAILURE_AT(file, line) << "'" << p << "' not in the error message: " << m;
        return m;
    } catch (const std::exception& e) {
        ADD_FAILURE_AT(file, line) << "expected a qtrain::Error, got another exception: " << e.what();
        return "";
    }
    ADD_FAILURE_AT(file, line) << "expected a qtrain::Error, nothing was thrown";
    return "";
}

// Runs a shell command, returns {exit code, stdout+stderr}.
struct RunResult {
    int exit_code;
    std::string output;
};
inline RunResult run_command(const std::string& cmd) {
    std::string full = cmd + " 2>&1";
    FILE* p = ::popen(full.c_str(), "r");
    if (!p) return {-1, "popen failed"};
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    int status = ::pclose(p);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return {code, out};
}

// n values drawn from N(0, scale^2) with qtrain::Rng: the same numbers on every platform.
inline std::vector<float> random_vector(size_t n, uint64_t seed, float scale = 1.0f) {
    Rng rng(seed);
    std::vector<float> v(n);
    for (auto& x : v) x = scale * rng.normal();
    return v;
}

}  // namespace qtrain::test

// EXPECT_ERROR(statement, "part", ...): the statement must throw a qtrain::Error whose message
// contains every part; evaluates to the message.
#define EXPECT_ERROR(stmt, ...) ::qtrain::test::expect_error([&] { stmt; }, {__VA_ARGS__}, __FILE__, __LINE__)
