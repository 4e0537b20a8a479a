#include "core/files.h"

#include <glob.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "core/error.h"

namespace qtrain {

namespace fs = std::filesystem;

// An ifstream opens a directory without complaint and reads nothing from it; say what it is instead
// of letting the empty text fail later as "not valid JSON".
static void check_not_directory(const std::string& path) {
    std::error_code ec;
    QT_CHECK(!fs::is_directory(path, ec), "'", path, "' is a directory, not a file");
}

std::string read_text_file(const std::string& path) {
    check_not_directory(path);
    std::ifstream in(path, std::ios::binary);
    QT_CHECK(in.good(), "cannot open '", path, "' for reading");
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

std::vector<uint8_t> read_binary_file(const std::string& path) {
    check_not_directory(path);
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    QT_CHECK(in.good(), "cannot open '", path, "' for reading");
    std::streamsize n = in.tellg();
    in.seekg(0);
    std::vector<uint8_t> data(static_cast<std::size_t>(n));
    if (n > 0) in.read(reinterpret_cast<char*>(data.data()), n);
    QT_CHECK(in.good() || in.eof(), "error reading '", path, "'");
    return data;
}

void write_file_atomic(const std::string& path, const void* data, std::size_t size) {
    fs::path p(path);
    if (p.has_parent_path()) fs::create_directories(p.parent_path());
    std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
        FILE* f = std::fopen(tmp.c_str(), "wb");
        QT_CHECK(f, "cannot open '", tmp, "' for writing");
        bool ok = size == 0 || std::fwrite(data, 1, size, f) == size;
        ok = (std::fflush(f) == 0) && ok;
        ok = (::fsync(::fileno(f)) == 0) && ok;
        ok = (std::fclose(f) == 0) && ok;
        if (!ok) {
            std::remove(tmp.c_str());
            throw_error(cat("error writing '", path, "' (disk full?)"));
        }
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
        std::remove(tmp.c_str());
        throw_error(cat("cannot rename '", tmp, "' to '", path, "': ", ec.message()));
    }
}

void write_text_file_atomic(const std::string& path, const std::string& text) {
    write_file_atomic(path, text.data(), text.size());
}

std::vector<std::string> expand_glob(const std::string& pattern, const std::string& what) {
    QT_CHECK(!pattern.empty(), what, ": no file given");
    glob_t g{};
    int rc = ::glob(pattern.c_str(), GLOB_TILDE | GLOB_BRACE, nullptr, &g);
    std::vector<std::string> files;
    if (rc == 0) {
        for (std::size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
    std::sort(files.begin(), files.end());
    std::string directory;  // a match that is a directory, for the message
    files.erase(std::remove_if(files.begin(), files.end(),
                               [&](const std::string& f) {
                                   const bool dir = fs::is_directory(f);
                                   if (dir && directory.empty()) directory = f;
                                   return dir;
                               }),
                files.end());
    if (files.empty() && !directory.empty())
        throw_error(cat(what, ": '", directory, "' is a directory, not a file", directory == pattern ? "" : cat(" (it matches '", pattern, "')"),
                        ": name the files in it, e.g. '", (fs::path(directory) / "*").string(), "' (quoted)"));
    QT_CHECK(!files.empty(), what, ": no file matches '", pattern, "'");
    return files;
}

std::string human_bytes(uint64_t bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(bytes);
    int u = 0;
    while (v >= 1024.0 && u < 4) { v /= 1024.0; ++u; }
    char buf[32];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
    return buf;
}

uint64_t parse_bytes(const std::string& text, const std::string& what) {
    const std::string usage = cat(what, ": expected a size like 24GiB, 512MiB or 1000000, got '", text, "'");
    std::size_t i = 0, dots = 0, digits = 0;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
        (text[i] == '.' ? dots : digits) += 1;
        ++i;
    }
    QT_CHECK(digits > 0 && dots <= 1, usage);
    const double v = std::strtod(text.substr(0, i).c_str(), nullptr);
    std::string unit = text.substr(i);
    unit.erase(std::remove_if(unit.begin(), unit.end(), ::isspace), unit.end());
    std::transform(unit.begin(), unit.end(), unit.begin(), ::tolower);
    double mult = 1;
    if (unit.empty() || unit == "b") mult = 1;
    else if (unit == "k" || unit == "kib") mult = 1024.0;
    else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
    else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
    else if (unit == "t" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
    else if (unit == "kb") mult = 1e3;
    else if (unit == "mb") mult = 1e6;
    else if (unit == "gb") mult = 1e9;
    else if (unit == "tb") mult = 1e12;
    else throw_error(cat(what, ": unknown size unit '", unit, "' in '", text, "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"));
    const double bytes = v * mult;
    QT_CHECK(bytes < 1.8e19, what, ": size '", text, "' is too large");
    return static_cast<uint64_t>(std::llround(bytes));
}

}  // namespace qtrain
