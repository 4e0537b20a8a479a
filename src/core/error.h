// Errors that say what went wrong and where: every message names the file, flag or tensor involved
// and the value that was expected. One exception type, so apps can print it and exit cleanly.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace qtrain {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Concatenates anything streamable; usable from .cu files too (no fmt there).
template <class... Args>
std::string cat(const Args&... args) {
    std::ostringstream out;
    (out << ... << args);
    return out.str();
}

[[noreturn]] void throw_error(const std::string& message);

}  // namespace qtrain

// QT_CHECK(cond, "part", value, "part", ...): throws qtrain::Error with the concatenated message.
#define QT_CHECK(cond, ...)                                                 \
    do {                                                                    \
        if (!(cond)) ::qtrain::throw_error(::qtrain::cat(__VA_ARGS__));     \
    } while (0)
