#include "io/block_format.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "io/safetensors.h"

namespace qtrain {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPrefix = "block-", kMiddle = "-of-", kSuffix = ".safetensors";

std::optional<int> five_digits(std::string_view s) {
    if (s.size() != 5 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return std::nullopt;
    return std::stoi(std::string(s));
}

int64_t parse_int(const SafeTensorsFile& f, const std::string& key, const std::string& text) {
    std::size_t used = 0;
    int64_t v = 0;
    try {
        v = std::stoll(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    QT_CHECK(used == text.size() && !text.empty(), f.path(), ": the block's metadata '", key, "' is '", text,
             "', not an integer");
    return v;
}

}  // namespace

std::string block_file_name(int rank, int world) {
    char name[64];
    std::snprintf(name, sizeof name, "block-%05d-of-%05d.safetensors", rank, world);
    return name;
}

std::optional<std::pair<int, int>> parse_block_file_name(std::string_view name) {
    const std::size_t n = kPrefix.size() + 5 + kMiddle.size() + 5 + kSuffix.size();
    if (name.size() != n || name.substr(0, kPrefix.size()) != kPrefix ||
        name.substr(kPrefix.size() + 5, kMiddle.size()) != kMiddle || name.substr(n - kSuffix.size()) != kSuffix)
        return std::nullopt;
    const auto rank = five_digits(name.substr(kPrefix.size(), 5));
    const auto world = five_digits(name.substr(kPrefix.size() + 5 + kMiddle.size(), 5));
    if (!rank || !world || *world < 1 || *rank >= *world) return std::nullopt;
    return std::make_pair(*rank, *world);
}

std::string block_piece_name(std::string_view array, int64_t piece) {
    return std::string(array) + "." + std::to_string(piece);
}

int64_t block_piece_count(int64_t elements, int64_t piece) { return (elements + piece - 1) / piece; }

void write_block_meta(SafeTensorsWriter& w, const BlockMeta& m) {
    w.set_metadata("format", kBlockFormat);
    w.set_metadata("rank", std::to_string(m.rank));
    w.set_metadata("world", std::to_string(m.world));
    w.set_metadata("begin", std::to_string(m.begin));
    w.set_metadata("end", std::to_string(m.end));
    w.set_metadata("total", std::to_string(m.total));
    w.set_metadata("piece_elements", std::to_string(m.piece));
    if (m.zero_level > 0) w.set_metadata("zero_level", std::to_string(m.zero_level));
    if (!m.layout.empty()) w.set_metadata("layout", m.layout);
}

BlockMeta read_block_meta(const SafeTensorsFile& f) {
    const auto& md = f.metadata();
    auto get = [&](const std::string& key) -> std::optional<std::string> {
        auto it = md.find(key);
        if (it == md.end()) return std::nullopt;
        return it->second;
    };
    auto required = [&](const std::string& key) {
        const auto v = get(key);
        QT_CHECK(v, f.path(), ": no '", key, "' in the block's metadata (not a qtrain block file?)");
        return *v;
    };
    const std::string format = required("format");
    QT_CHECK(format == kBlockFormat, f.path(), ": the metadata's format is '", format, "', expected '", kBlockFormat,
             "'");
    BlockMeta m;
    m.rank = static_cast<int>(parse_int(f, "rank", required("rank")));
    m.world = static_cast<int>(parse_int(f, "world", required("world")));
    m.begin = parse_int(f, "begin", required("begin"));
    m.end = parse_int(f, "end", required("end"));
    m.total = parse_int(f, "total", required("total"));
    if (const auto p = get("piece_elements")) m.piece = parse_int(f, "piece_elements", *p);
    if (const auto z = get("zero_level")) m.zero_level = static_cast<int>(parse_int(f, "zero_level", *z));
    if (const auto l = get("layout")) m.layout = *l;
    QT_CHECK(m.world >= 1 && m.rank >= 0 && m.rank < m.world, f.path(), ": the block's metadata says rank ", m.rank,
             " of ", m.world);
    QT_CHECK(0 <= m.begin && m.begin <= m.end && m.end <= m.total, f.path(), ": the block's range [", m.begin, ", ",
             m.end, ") does not lie in the flat space of ", m.total, " elements");
    QT_CHECK(m.piece > 0, f.path(), ": the block's piece_elements is ", m.piece);
    return m;
}

std::vector<std::string> list_block_like_files(const std::string& dir) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind(kPrefix, 0) == 0) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
}

}  // namespace qtrain
