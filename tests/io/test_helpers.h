// Shared by the io tests: a self-cleaning temp directory and an error-message check.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace qtrain::testing {

// A fresh directory per test, removed afterwards.
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        static std::atomic<int> counter{0};
        path = std::filesystem::temp_directory_path() /
               ("qtrain_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
    // Number of entries directly in the directory (to see that no temp file was left behind).
    int count() const {
        int n = 0;
        for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path)) ++n;
        return n;
    }
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Runs `f`, expecting a qtrain::Error whose message contains every one of `parts`; returns it.
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

}  // namespace qtrain::testing

#define EXPECT_ERROR(stmt, ...) ::qtrain::testing::expect_error([&] { stmt; }, {__VA_ARGS__}, __FILE__, __LINE__)
