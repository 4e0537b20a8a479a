// safetensors reading (mmap + full header validation) and writing (streamed, temp file + rename).
// The reader trusts nothing in the file: every offset is checked against the data section before a
// pointer into the mapping is ever handed out, so a corrupt file gives an error, not a crash.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace qtrain {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so is the host code");

namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// A header larger than this is not a real model (HF's own reader caps it at 100 MB too); refusing it
// early avoids parsing garbage when the first 8 bytes are not a length at all.
static constexpr uint64_t kMaxHeaderBytes = 100'000'000;

static std::string shape_str(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

std::string safetensors_dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "F32";
        case DType::BF16: return "BF16";
        case DType::F16: return "F16";
        case DType::E4M3: return "F8_E4M3";
        case DType::E5M2: return "F8_E5M2";
        case DType::I32: return "I32";
        case DType::U8: return "U8";
    }
    throw_error(cat("safetensors: no dtype name for dtype #", static_cast<int>(t)));
}

DType parse_safetensors_dtype(const std::string& s, const std::string& context) {
    for (DType t : {DType::F32, DType::BF16, DType::F16, DType::E4M3, DType::E5M2, DType::I32, DType::U8})
        if (s == safetensors_dtype_name(t)) return t;
    throw_error(cat(context, ": unknown or unsupported safetensors dtype '", s,
                    "' (expected one of F32, BF16, F16, F8_E4M3, F8_E5M2, I32, U8)"));
}

// ---------------------------------------------------------------------------------------------
// SafeTensorsFile
// ---------------------------------------------------------------------------------------------

// Reads one non-negative integer that must fit in uint64 (shape dims, offsets).
static uint64_t get_u64(const json& v, const std::string& where) {
    QT_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), where,
             " must be a non-negative integer, got ", v.dump());
    return v.get<uint64_t>();
}

static SafeTensorInfo parse_tensor_entry(const std::string& name, const json& e, const std::string& path,
                                         uint64_t data_size) {
    const std::string where = cat(path, ": tensor '", name, "'");
    QT_CHECK(e.is_object(), where, ": expected an object {dtype, shape, data_offsets}, got ", e.type_name());
    for (const char* key : {"dtype", "shape", "data_offsets"})
        QT_CHECK(e.contains(key), where, ": missing field '", key, "'");
    QT_CHECK(e["dtype"].is_string(), where, ": 'dtype' must be a string, got ", e["dtype"].dump());
    SafeTensorInfo info;
    info.name = name;
    info.file = path;
    info.dtype = parse_safetensors_dtype(e["dtype"].get<std::string>(), where);

    const json& shape = e["shape"];
    QT_CHECK(shape.is_array(), where, ": 'shape' must be an array, got ", shape.dump());
    for (const json& d : shape) {
        uint64_t dim = get_u64(d, where + " shape entry");
        QT_CHECK(dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), where, ": shape entry ", dim,
                 " is too large");
        info.shape.push_back(static_cast<int64_t>(dim));
    }
    // numel * element size, saturating: a hostile shape must not wrap around and pass the size check.
    const bool empty = std::find(info.shape.begin(), info.shape.end(), 0) != info.shape.end();
    bool overflow = false;
    uint64_t bytes = dtype_size(info.dtype);
    for (int64_t d : info.shape) {
        if (empty || overflow) break;
        overflow = __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes);
    }
    if (empty) bytes = 0;

    const json& off = e["data_offsets"];
    QT_CHECK(off.is_array() && off.size() == 2, where, ": 'data_offsets' must be [begin, end], got ", off.dump());
    info.begin = get_u64(off[0], where + " data_offsets[0]");
    info.end = get_u64(off[1], where + " data_offsets[1]");
    QT_CHECK(info.begin <= info.end, where, ": data_offsets [", info.begin, ", ", info.end, "] have begin > end");
    QT_CHECK(info.end <= data_size, where, ": data_offsets [", info.begin, ", ", info.end,
             "] reach past the end of the data section (", data_size, " bytes; file truncated?)");
    const uint64_t have = info.end - info.begin;
    QT_CHECK(!overflow && bytes == have, where, ": ", e["dtype"].get<std::string>(), " ", shape_str(info.shape),
             " needs ", overflow ? std::string("more than 2^64") : std::to_string(bytes),
             " bytes but data_offsets [", info.begin, ", ", info.end, "] span ", have, " bytes");
    return info;
}

SafeTensorsFile::SafeTensorsFile(const std::string& path) : path_(path), file_(path, "safetensors file") {
    const uint64_t file_size = file_.size();
    QT_CHECK(file_size >= 8, path, ": not a safetensors file: ", file_size,
             " bytes, shorter than the 8-byte header length");
    {
        const unsigned char* bytes = file_.data();
        uint64_t header_len = 0;
        std::memcpy(&header_len, bytes, 8);
        QT_CHECK(header_len <= kMaxHeaderBytes, path, ": header length ", header_len,
                 " bytes is absurd (limit ", kMaxHeaderBytes, "); not a safetensors file?");
        QT_CHECK(header_len <= file_size - 8, path, ": header length ", header_len, " bytes exceeds the file (",
                 file_size, " bytes, so at most ", file_size - 8, "); truncated or not a safetensors file?");
        data_start_ = 8 + header_len;
        const uint64_t data_size = file_size - data_start_;

        json header;
        try {
            header = json::parse(reinterpret_cast<const char*>(bytes + 8),
                                 reinterpret_cast<const char*>(bytes + 8 + header_len));
        } catch (const json::exception& e) {
            throw_error(cat(path, ": safetensors header is not valid JSON (", e.what(), ")"));
        }
        QT_CHECK(header.is_object(), path, ": safetensors header must be a JSON object, got ", header.type_name());

        for (const auto& [name, entry] : header.items()) {
            if (name == "__metadata__") {
                QT_CHECK(entry.is_object() || entry.is_null(), path, ": '__metadata__' must be an object of strings");
                if (entry.is_null()) continue;
                for (const auto& [k, v] : entry.items()) {
                    QT_CHECK(v.is_string(), path, ": __metadata__ value for '", k, "' must be a string, got ",
                             v.dump());
                    metadata_[k] = v.get<std::string>();
                }
                continue;
            }
            tensors_.push_back(parse_tensor_entry(name, entry, path, data_size));
        }

        // Data order (as written), which also makes the overlap check a scan of neighbours.
        std::sort(tensors_.begin(), tensors_.end(), [](const SafeTensorInfo& a, const SafeTensorInfo& b) {
            return a.begin != b.begin ? a.begin < b.begin : a.end != b.end ? a.end < b.end : a.name < b.name;
        });
        const SafeTensorInfo* prev = nullptr;
        for (const auto& t : tensors_) {
            if (t.begin == t.end) continue;  // empty tensors occupy no bytes
            QT_CHECK(!prev || t.begin >= prev->end, path, ": tensor '", t.name, "' (bytes [", t.begin, ", ", t.end,
                     ")) overlaps tensor '", prev ? prev->name : "", "' (bytes [", prev ? prev->begin : 0, ", ",
                     prev ? prev->end : 0, "))");
            prev = &t;
        }
    }
}

SafeTensorsFile::~SafeTensorsFile() = default;

const SafeTensorInfo* SafeTensorsFile::find(const std::string& name) const {
    for (const auto& t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

const void* SafeTensorsFile::data(const SafeTensorInfo& info) const {
    QT_CHECK(info.file == path_ && info.end <= file_.size() - data_start_, path_, ": tensor '", info.name,
             "' does not belong to this file (it is in '", info.file, "')");
    return reinterpret_cast<const char*>(file_.data()) + data_start_ + info.begin;
}

// ---------------------------------------------------------------------------------------------
// SafeTensorsReader
// ---------------------------------------------------------------------------------------------

SafeTensorsReader::SafeTensorsReader(const std::vector<std::string>& files) {
    QT_CHECK(!files.empty(), "safetensors: no files given");
    for (const auto& path : files) {
        files_.push_back(std::make_shared<SafeTensorsFile>(path));
        const int fi = static_cast<int>(files_.size()) - 1;
        for (const auto& t : files_.back()->tensors()) {
            auto [it, inserted] = index_.emplace(t.name, std::make_pair(fi, &t));
            QT_CHECK(inserted, "tensor '", t.name, "' appears in both '", files_[it->second.first]->path(), "' and '",
                     path, "'");
        }
    }
}

SafeTensorsReader SafeTensorsReader::open_dir(const std::string& dir) {
    const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
    const fs::path single = fs::path(dir) / "model.safetensors";
    std::error_code ec;
    if (!fs::exists(index_path, ec)) {
        QT_CHECK(fs::exists(single, ec), "'", dir, "': no model.safetensors or model.safetensors.index.json there");
        return SafeTensorsReader({single.string()});
    }

    const std::string ipath = index_path.string();
    json index;
    {
        FILE* f = std::fopen(ipath.c_str(), "rb");
        QT_CHECK(f, "cannot open '", ipath, "': ", std::strerror(errno));
        std::string text;
        char buf[65536];
        std::size_t n;
        while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
        std::fclose(f);
        try {
            index = json::parse(text);
        } catch (const json::exception& e) {
            throw_error(cat(ipath, ": not valid JSON (", e.what(), ")"));
        }
    }
    QT_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), ipath,
             ": expected an object with a \"weight_map\": {tensor: file} object");

    // Shards in first-mention order; each must exist before any is mapped.
    std::vector<std::string> shards;
    std::set<std::string> seen;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
        QT_CHECK(file.is_string(), ipath, ": weight_map entry for tensor '", tensor, "' must be a file name, got ",
                 file.dump());
        std::string shard = (fs::path(dir) / file.get<std::string>()).string();
        if (seen.insert(shard).second) {
            QT_CHECK(fs::exists(shard, ec), ipath, ": shard '", shard, "' (holding tensor '", tensor,
                     "') does not exist");
            shards.push_back(shard);
        }
    }
    QT_CHECK(!shards.empty(), ipath, ": weight_map is empty");
    SafeTensorsReader reader(shards);
    // The index is a promise about where each tensor is; a stale index means mixed-up shards.
    for (const auto& [tensor, file] : index["weight_map"].items()) {
        std::string shard = (fs::path(dir) / file.get<std::string>()).string();
        auto it = reader.index_.find(tensor);
        QT_CHECK(it != reader.index_.end(), ipath, ": tensor '", tensor, "' is listed in shard '", shard,
                 "' but is not in it");
        QT_CHECK(reader.files_[it->second.first]->path() == shard, ipath, ": tensor '", tensor, "' is listed in '",
                 shard, "' but found in '", reader.files_[it->second.first]->path(), "'");
    }
    return reader;
}

bool SafeTensorsReader::has(const std::string& name) const { return index_.count(name) != 0; }

const SafeTensorInfo& SafeTensorsReader::info(const std::string& name) const {
    auto it = index_.find(name);
    QT_CHECK(it != index_.end(), "tensor '", name, "' not found in ", describe());
    return *it->second.second;
}

std::vector<std::string> SafeTensorsReader::names() const {
    std::vector<std::string> out;
    out.reserve(index_.size());
    for (const auto& kv : index_) out.push_back(kv.first);
    return out;
}

Tensor SafeTensorsReader::view(const std::string& name) const {
    const auto& i = info(name);
    QT_CHECK(i.shape.size() <= Tensor::kMaxDims, i.file, ": tensor '", name, "' has ", i.shape.size(),
             " dimensions; a Tensor view holds at most ", Tensor::kMaxDims);
    Tensor t;
    // The mapping is read-only (PROT_READ): writing through this view faults, by design.
    t.data = const_cast<void*>(files_[index_.at(name).first]->data(i));
    t.dtype = i.dtype;
    t.device = Device::CPU;
    for (int64_t d : i.shape) t.shape[t.ndim++] = d;
    return t;
}

// Converts `n` elements (possibly unaligned: tensors are packed back to back) to fp32.
static void convert_to_f32(const unsigned char* src, DType dtype, int64_t n, float* out) {
    switch (dtype) {
        case DType::F32:
            std::memcpy(out, src, static_cast<std::size_t>(n) * 4);
            return;
        case DType::BF16:
        case DType::F16:
            for (int64_t i = 0; i < n; ++i) {
                uint16_t v;
                std::memcpy(&v, src + 2 * i, 2);
                out[i] = dtype == DType::BF16 ? bf16_to_float(v) : fp16_to_float(v);
            }
            return;
        case DType::E4M3:
            for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_float(src[i]);
            return;
        case DType::E5M2:
            for (int64_t i = 0; i < n; ++i) out[i] = e5m2_to_float(src[i]);
            return;
        default: break;
    }
}

static void check_floating(const SafeTensorInfo& i) {
    QT_CHECK(i.dtype == DType::F32 || i.dtype == DType::BF16 || i.dtype == DType::F16 || i.dtype == DType::E4M3 ||
                 i.dtype == DType::E5M2,
             i.file, ": tensor '", i.name, "' has dtype ", safetensors_dtype_name(i.dtype),
             ", expected a floating type (F32, BF16, F16, F8_E4M3, F8_E5M2)");
}

// out[0, n) were read from elements [first, first + n) of tensor i: a NaN or Inf is an error.
static void check_finite(const SafeTensorInfo& i, const float* out, int64_t first, int64_t n) {
    // Exponent bits all set = Inf or NaN; a branch-free pass over the bits vectorises (and does not
    // depend on how the compiler treats isfinite), the slow search runs only when one was found.
    uint32_t any_bad = 0;
    for (int64_t k = 0; k < n; ++k) any_bad |= (std::bit_cast<uint32_t>(out[k]) & 0x7f800000u) == 0x7f800000u;
    if (!any_bad) return;
    for (int64_t k = 0; k < n; ++k)
        if (!std::isfinite(out[k]))
            throw_error(cat(i.file, ": tensor '", i.name, "' holds a non-finite value (", out[k], " at element ",
                            first + k, " of ", i.numel(),
                            "): the file is corrupt or was written from a diverged run"));
}

void SafeTensorsFile::read_finite_f32(const SafeTensorInfo& info, int64_t first, int64_t count, float* out) const {
    QT_CHECK(first >= 0 && count >= 0 && first + count <= info.numel(), path_, ": elements [", first, ", ",
             first + count, ") of tensor '", info.name, "' asked for, but it has ", info.numel());
    check_floating(info);
    const auto* src = static_cast<const unsigned char*>(data(info)) + first * static_cast<int64_t>(dtype_size(info.dtype));
    convert_to_f32(src, info.dtype, count, out);
    check_finite(info, out, first, count);
}

void SafeTensorsReader::read_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                                 float* out) const {
    const auto& i = info(name);
    QT_CHECK(i.shape == expected_shape, i.file, ": tensor '", name, "' has shape ", shape_str(i.shape),
             " but expected ", shape_str(expected_shape));
    check_floating(i);
    const auto* src = static_cast<const unsigned char*>(files_[index_.at(name).first]->data(i));
    convert_to_f32(src, i.dtype, i.numel(), out);
}

void SafeTensorsReader::read_finite_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                                        float* out) const {
    read_f32(name, expected_shape, out);
    const auto& i = info(name);
    check_finite(i, out, 0, i.numel());
}

std::string SafeTensorsReader::describe() const {
    if (files_.size() == 1) return "'" + files_[0]->path() + "'";
    std::string s = std::to_string(files_.size()) + " files (";
    for (std::size_t i = 0; i < files_.size(); ++i) s += (i ? ", '" : "'") + files_[i]->path() + "'";
    return s + ")";
}

// ---------------------------------------------------------------------------------------------
// SafeTensorsWriter
// ---------------------------------------------------------------------------------------------

static void check_new_entry(const std::string& name, const std::vector<int64_t>& shape, const void* data,
                            const std::vector<std::string>& existing) {
    QT_CHECK(!name.empty() && name != "__metadata__", "SafeTensorsWriter: invalid tensor name '", name, "'");
    QT_CHECK(std::find(existing.begin(), existing.end(), name) == existing.end(), "SafeTensorsWriter: tensor '", name,
             "' added twice");
    int64_t n = 1;
    for (int64_t d : shape) {
        QT_CHECK(d >= 0, "SafeTensorsWriter: tensor '", name, "' has a negative dimension in ", shape_str(shape));
        n *= d;
    }
    QT_CHECK(data || n == 0, "SafeTensorsWriter: tensor '", name, "' has no data");
}

void SafeTensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data) {
    std::vector<std::string> names;
    for (const auto& e : entries_) names.push_back(e.name);
    check_new_entry(name, shape, data, names);
    entries_.push_back(Entry{name, dtype, std::move(shape), data, false});
}

void SafeTensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape, const float* data,
                                DType storage) {
    QT_CHECK(storage == DType::F32 || storage == DType::BF16 || storage == DType::F16, "SafeTensorsWriter: tensor '",
             name, "': fp32 data can be stored as F32, BF16 or F16, not ", safetensors_dtype_name(storage));
    std::vector<std::string> names;
    for (const auto& e : entries_) names.push_back(e.name);
    check_new_entry(name, shape, data, names);
    entries_.push_back(Entry{name, storage, std::move(shape), data, true});
}

void SafeTensorsWriter::add_f32_deferred(const std::string& name, std::vector<int64_t> shape,
                                         std::function<std::vector<float>()> produce, DType storage) {
    static const float kPlaceholder = 0.0f;  // the data pointer is only checked for presence
    add_f32(name, std::move(shape), &kPlaceholder, storage);
    entries_.back().produce = std::move(produce);
}

void SafeTensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

namespace {
// Removes the temporary file unless the write got all the way to the rename.
struct TempFile {
    std::string path;
    FILE* f = nullptr;
    bool keep = false;
    ~TempFile() {
        if (f) std::fclose(f);
        if (!keep) std::remove(path.c_str());
    }
};
}  // namespace

void SafeTensorsWriter::write(const std::string& path) const {
    auto numel = [](const Entry& e) {
        int64_t n = 1;
        for (int64_t d : e.shape) n *= d;
        return static_cast<uint64_t>(n);
    };

    ordered_json header = ordered_json::object();
    if (!metadata_.empty()) {
        ordered_json m = ordered_json::object();
        for (const auto& [k, v] : metadata_) m[k] = v;
        header["__metadata__"] = m;
    }
    uint64_t offset = 0;
    for (const auto& e : entries_) {
        uint64_t bytes = numel(e) * dtype_size(e.dtype);
        header[e.name] = {{"dtype", safetensors_dtype_name(e.dtype)},
                          {"shape", e.shape},
                          {"data_offsets", {offset, offset + bytes}}};
        offset += bytes;
    }
    std::string text = header.dump();
    // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned.
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t header_len = text.size();

    fs::path p(path);
    if (p.has_parent_path()) fs::create_directories(p.parent_path());
    TempFile tmp{path + ".tmp." + std::to_string(::getpid())};
    tmp.f = std::fopen(tmp.path.c_str(), "wb");
    QT_CHECK(tmp.f, "cannot open '", tmp.path, "' for writing: ", std::strerror(errno));
    auto put = [&](const void* data, std::size_t n) {
        QT_CHECK(n == 0 || std::fwrite(data, 1, n, tmp.f) == n, "error writing '", path, "' (disk full?)");
    };
    put(&header_len, 8);
    put(text.data(), text.size());

    constexpr std::size_t kChunkElems = 1 << 20;  // bounds the conversion buffer (and each fwrite) to a few MB
    std::vector<unsigned char> buf;
    for (const auto& e : entries_) {
        const uint64_t n = numel(e);
        const std::size_t esize = dtype_size(e.dtype);
        const void* data = e.data;
        std::vector<float> produced;  // add_f32_deferred: this tensor only, freed after it is written
        if (e.produce) {
            produced = e.produce();
            QT_CHECK(produced.size() == n, "SafeTensorsWriter: tensor '", e.name, "' produced ", produced.size(),
                     " values for shape ", shape_str(e.shape));
            data = produced.data();
        }
        if (!e.from_f32 || e.dtype == DType::F32) {
            const auto* src = static_cast<const unsigned char*>(data);
            for (uint64_t i = 0; i < n; i += kChunkElems) put(src + i * esize, std::min<uint64_t>(kChunkElems, n - i) * esize);
            continue;
        }
        const auto* src = static_cast<const float*>(data);
        buf.resize(kChunkElems * esize);
        for (uint64_t i = 0; i < n; i += kChunkElems) {
            const std::size_t m = std::min<uint64_t>(kChunkElems, n - i);
            // on all cores: single-threaded, this conversion was ~1.8 ns per value (26 s for 14B)
            const bool bf16 = e.dtype == DType::BF16;
#pragma omp parallel for schedule(static) if (m > (1u << 16))
            for (std::size_t k = 0; k < m; ++k) {
                const uint16_t v = bf16 ? float_to_bf16(src[i + k]) : float_to_fp16(src[i + k]);
                std::memcpy(buf.data() + 2 * k, &v, 2);
            }
            put(buf.data(), m * esize);
        }
    }
    bool ok = std::fflush(tmp.f) == 0;
    ok = ::fsync(::fileno(tmp.f)) == 0 && ok;
    ok = std::fclose(tmp.f) == 0 && ok;
    tmp.f = nullptr;
    QT_CHECK(ok, "error writing '", path, "' (disk full?)");
    std::error_code ec;
    fs::rename(tmp.path, path, ec);
    QT_CHECK(!ec, "cannot rename '", tmp.path, "' to '", path, "': ", ec.message());
    tmp.keep = true;
}

}  // namespace qtrain
