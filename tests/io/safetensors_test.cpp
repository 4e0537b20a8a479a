// safetensors: what we write must be byte-exact per the spec (transformers reads it), and what we
// read may be anything — every malformed header must give an error naming the file and tensor.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/files.h"
#include "test_util.h"

namespace qtrain {
namespace {

using json = nlohmann::ordered_json;
using test::Contains;
using test::TempDir;
using test::write_file;
namespace fs = std::filesystem;

// A safetensors file from a header text and a data blob; `len` overrides the length field.
std::string raw_file(const std::string& header, const std::string& data, uint64_t len = UINT64_MAX) {
    uint64_t n = len == UINT64_MAX ? header.size() : len;
    std::string out(8, '\0');
    std::memcpy(out.data(), &n, 8);
    return out + header + data;
}

std::vector<float> iota_floats(int n, float scale) {
    std::vector<float> v(n);
    for (int i = 0; i < n; ++i) v[i] = (i - n / 2) * scale;
    return v;
}

TEST(SafeTensors, DtypeNames) {
    EXPECT_EQ(safetensors_dtype_name(DType::E4M3), "F8_E4M3");
    EXPECT_EQ(safetensors_dtype_name(DType::BF16), "BF16");
    for (DType t : {DType::F32, DType::BF16, DType::F16, DType::E4M3, DType::E5M2, DType::I32, DType::U8})
        EXPECT_EQ(parse_safetensors_dtype(safetensors_dtype_name(t), "ctx"), t);
    EXPECT_ERROR(parse_safetensors_dtype("F64", "model.safetensors: tensor 'w'"), "F64", "tensor 'w'");
}

TEST(SafeTensors, RoundTripBytesAndLayout) {
    TempDir d;
    const std::vector<float> a = iota_floats(6, 0.37f);
    const std::vector<float> b = iota_floats(5, 1.01f);
    const std::vector<uint16_t> c = {0x3f80, 0x4000, 0xc040};  // 3 raw bf16: the next tensor starts unaligned
    const std::vector<int32_t> ids = {7, -1, 151643};
    SafeTensorsWriter w;
    w.add("layer.a", DType::F32, {2, 3}, a.data());
    w.add_f32("layer.b", {5}, b.data(), DType::BF16);
    w.add("c", DType::BF16, {3}, c.data());
    w.add("ids", DType::I32, {3}, ids.data());
    w.add_f32("half", {1, 5}, b.data(), DType::F16);
    w.set_metadata("format", "pt");
    w.set_metadata("step", "12");
    const std::string path = d.file("model.safetensors");
    w.write(path);
    EXPECT_EQ(d.count(), 1) << "temporary file left behind";

    // Byte layout: u64 header length, a space-padded JSON header with entries in the order added.
    const std::vector<uint8_t> bytes = read_binary_file(path);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ(n % 8, 0u);
    const std::string header(bytes.begin() + 8, bytes.begin() + 8 + n);
    EXPECT_EQ(header.front(), '{');
    EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));
    const json j = json::parse(header);
    std::vector<std::string> keys;
    for (const auto& [k, v] : j.items()) keys.push_back(k);
    EXPECT_EQ(keys, (std::vector<std::string>{"__metadata__", "layer.a", "layer.b", "c", "ids", "half"}));
    EXPECT_EQ(j["layer.b"]["dtype"], "BF16");
    EXPECT_EQ(j["layer.b"]["data_offsets"], json::parse("[24, 34]"));
    EXPECT_EQ(j["ids"]["data_offsets"], json::parse("[40, 52]"));
    EXPECT_EQ(bytes.size(), 8 + n + 24 + 10 + 6 + 12 + 10);

    SafeTensorsFile f(path);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("step"), "12");
    ASSERT_EQ(f.tensors().size(), 5u);
    EXPECT_EQ(f.tensors()[0].name, "layer.a");  // data order = order added
    EXPECT_EQ(f.tensors()[4].name, "half");
    const SafeTensorInfo* ia = f.find("layer.a");
    ASSERT_TRUE(ia);
    EXPECT_EQ(ia->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(ia->file, path);
    EXPECT_EQ(std::memcmp(f.data(*ia), a.data(), 24), 0);
    EXPECT_EQ(std::memcmp(f.data(*f.find("c")), c.data(), 6), 0);
    EXPECT_EQ(std::memcmp(f.data(*f.find("ids")), ids.data(), 12), 0);
    const auto* pb = static_cast<const uint8_t*>(f.data(*f.find("layer.b")));
    for (int i = 0; i < 5; ++i) {
        uint16_t v;
        std::memcpy(&v, pb + 2 * i, 2);
        EXPECT_EQ(v, float_to_bf16(b[i]));
    }
    EXPECT_EQ(f.find("nope"), nullptr);

    SafeTensorsReader r({path});
    std::vector<float> out(6);
    r.read_f32("layer.a", {2, 3}, out.data());
    EXPECT_EQ(out, a);
    out.resize(5);
    r.read_f32("layer.b", {5}, out.data());
    for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], round_through(b[i], DType::BF16));
    r.read_f32("half", {1, 5}, out.data());
    for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], round_through(b[i], DType::F16));
    out.resize(3);
    r.read_f32("c", {3}, out.data());  // unaligned source
    EXPECT_EQ(out, (std::vector<float>{1.0f, 2.0f, -3.0f}));
    EXPECT_EQ(r.names(), (std::vector<std::string>{"c", "half", "ids", "layer.a", "layer.b"}));

    Tensor t = r.view("layer.a");
    EXPECT_EQ(t.dtype, DType::F32);
    EXPECT_EQ(t.ndim, 2);
    EXPECT_EQ(t.shape_str(), "[2, 3]");
    EXPECT_EQ(t.as<float>()[5], a[5]);
}

TEST(SafeTensors, EmptyScalarAndZeroSizeTensors) {
    TempDir d;
    {
        SafeTensorsWriter w;  // no tensors, no metadata: header "{}" padded
        w.write(d.file("empty.safetensors"));
        SafeTensorsFile f(d.file("empty.safetensors"));
        EXPECT_TRUE(f.tensors().empty());
        EXPECT_TRUE(f.metadata().empty());
        EXPECT_EQ(fs::file_size(d.file("empty.safetensors")), 16u);
    }
    const float s = 2.5f;
    SafeTensorsWriter w;
    w.add("zero", DType::F32, {0, 4}, nullptr);
    w.add("scalar", DType::F32, {}, &s);
    w.add("zero2", DType::BF16, {3, 0}, nullptr);
    w.write(d.file("m.safetensors"));
    SafeTensorsReader r({d.file("m.safetensors")});
    float out = 0;
    r.read_f32("scalar", {}, &out);
    EXPECT_EQ(out, 2.5f);
    EXPECT_EQ(r.info("zero").numel(), 0);
    EXPECT_EQ(r.info("zero2").begin, r.info("zero2").end);
}

TEST(SafeTensors, LargeTensorConvertsAcrossChunks) {
    TempDir d;
    const int n = (1 << 20) + 3;  // more than one conversion chunk
    std::vector<float> x(n);
    for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1000) * 0.001f - 0.5f;
    SafeTensorsWriter w;
    w.add_f32("big", {n}, x.data(), DType::BF16);
    w.add_f32("big32", {n}, x.data());
    w.write(d.file("m.safetensors"));
    SafeTensorsReader r({d.file("m.safetensors")});
    std::vector<float> out(n);
    r.read_f32("big", {n}, out.data());
    for (int i : {0, 1, (1 << 20) - 1, 1 << 20, n - 1}) EXPECT_EQ(out[i], round_through(x[i], DType::BF16)) << i;
    r.read_f32("big32", {n}, out.data());
    EXPECT_EQ(out, x);
}

// Deferred tensors are produced when write() reaches them, in file order, one at a time, and are
// stored exactly like add_f32's; a producer returning the wrong count is an error naming the tensor.
TEST(SafeTensors, DeferredTensorsAreProducedWhileWriting) {
    TempDir d;
    std::vector<float> a = {1.5f, -2.25f, 3.0f}, b = {0.1f, 0.2f};
    std::vector<std::string> calls;
    SafeTensorsWriter w;
    w.add_f32_deferred("a", {3}, [&] { calls.push_back("a"); return a; });
    w.add_f32_deferred("b", {2}, [&] { calls.push_back("b"); return b; }, DType::BF16);
    EXPECT_TRUE(calls.empty());
    w.write(d.file("m.safetensors"));
    EXPECT_EQ(calls, (std::vector<std::string>{"a", "b"}));
    SafeTensorsReader r({d.file("m.safetensors")});
    std::vector<float> out(3);
    r.read_f32("a", {3}, out.data());
    EXPECT_EQ(out, a);
    out.resize(2);
    r.read_f32("b", {2}, out.data());
    EXPECT_EQ(out[1], round_through(0.2f, DType::BF16));
    SafeTensorsWriter bad;
    bad.add_f32_deferred("short", {4}, [] { return std::vector<float>(3); });
    EXPECT_ERROR(bad.write(d.file("bad.safetensors")), "short", "3");
}

TEST(SafeTensors, ReadF32ConvertsFp8AndFp16) {
    TempDir d;
    std::vector<uint8_t> e4(256), e5(256);
    std::vector<uint16_t> h(300);
    for (int i = 0; i < 256; ++i) e4[i] = e5[i] = static_cast<uint8_t>(i);
    for (int i = 0; i < 300; ++i) h[i] = static_cast<uint16_t>(i * 211);
    SafeTensorsWriter w;
    w.add("e4", DType::E4M3, {16, 16}, e4.data());
    w.add("e5", DType::E5M2, {256}, e5.data());
    w.add("h", DType::F16, {3, 100}, h.data());
    w.write(d.file("m.safetensors"));
    SafeTensorsReader r({d.file("m.safetensors")});
    std::vector<float> out(300);
    auto same = [](float x, float y) { return (std::isnan(x) && std::isnan(y)) || x == y; };
    r.read_f32("e4", {16, 16}, out.data());
    for (int i = 0; i < 256; ++i) EXPECT_TRUE(same(out[i], e4m3_to_float(static_cast<uint8_t>(i)))) << i;
    r.read_f32("e5", {256}, out.data());
    for (int i = 0; i < 256; ++i) EXPECT_TRUE(same(out[i], e5m2_to_float(static_cast<uint8_t>(i)))) << i;
    r.read_f32("h", {3, 100}, out.data());
    for (int i = 0; i < 300; ++i) EXPECT_TRUE(same(out[i], fp16_to_float(h[i]))) << i;
}

TEST(SafeTensors, ReadErrorsNameTensorFileAndShapes) {
    TempDir d;
    const std::vector<float> a(6, 1.0f);
    const int32_t ids[2] = {1, 2};
    const float five[5] = {};
    SafeTensorsWriter w;
    w.add("w", DType::F32, {2, 3}, a.data());
    w.add("ids", DType::I32, {2}, ids);
    w.add("five_d", DType::F32, {1, 1, 1, 1, 5}, five);
    const std::string path = d.file("m.safetensors");
    w.write(path);
    SafeTensorsReader r({path});
    std::vector<float> out(6);
    EXPECT_ERROR(r.read_f32("w", {3, 2}, out.data()), "'w'", path, "[2, 3]", "[3, 2]");
    EXPECT_ERROR(r.read_f32("w", {6}, out.data()), "'w'", "[2, 3]", "[6]");
    EXPECT_ERROR(r.read_f32("ids", {2}, out.data()), "'ids'", "I32", path);
    EXPECT_ERROR(r.info("model.embed_tokens.weight"), "'model.embed_tokens.weight'", "not found", path);
    EXPECT_ERROR(r.read_f32("lm_head.weight", {6}, out.data()), "'lm_head.weight'", path);
    EXPECT_ERROR(r.view("missing"), "'missing'", path);
    EXPECT_ERROR(r.view("five_d"), "'five_d'", "5 dimensions");
    EXPECT_FALSE(r.has("missing"));
    EXPECT_TRUE(r.has("w"));
}

TEST(SafeTensors, WriterRejectsBadEntries) {
    const float x[2] = {1, 2};
    SafeTensorsWriter w;
    w.add_f32("x", {2}, x);
    EXPECT_ERROR(w.add_f32("x", {2}, x), "'x'", "twice");
    EXPECT_ERROR(w.add("x", DType::F32, {2}, x), "'x'", "twice");
    EXPECT_ERROR(w.add_f32("q", {2}, x, DType::E4M3), "'q'", "F8_E4M3");
    EXPECT_ERROR(w.add("__metadata__", DType::F32, {2}, x), "__metadata__");
    EXPECT_ERROR(w.add("", DType::F32, {2}, x), "invalid tensor name");
    EXPECT_ERROR(w.add("neg", DType::F32, {-1, 2}, x), "'neg'", "negative");
    EXPECT_ERROR(w.add("null", DType::F32, {2}, nullptr), "'null'", "no data");
}

TEST(SafeTensors, WriteFailureLeavesNoTempFile) {
    TempDir d;
    fs::create_directories(d.path / "out.safetensors" / "inner");  // cannot be replaced by a file
    const float x = 1;
    SafeTensorsWriter w;
    w.add_f32("x", {1}, &x);
    EXPECT_ERROR(w.write(d.file("out.safetensors")), d.file("out.safetensors"));
    EXPECT_EQ(d.count(), 1);
    // Parent directories are created as needed.
    w.write(d.file("a/b/model.safetensors"));
    EXPECT_TRUE(fs::exists(d.file("a/b/model.safetensors")));
}

// ------------------------------------------------------------------ multi-file and directories

void write_shard(const std::string& path, const std::vector<std::string>& names, float value) {
    std::vector<std::vector<float>> data;
    SafeTensorsWriter w;
    for (const auto& n : names) data.emplace_back(4, value);
    for (std::size_t i = 0; i < names.size(); ++i) w.add_f32(names[i], {2, 2}, data[i].data());
    w.write(path);
}

TEST(SafeTensorsDir, SingleFile) {
    TempDir d;
    write_shard(d.file("model.safetensors"), {"a"}, 1.0f);
    SafeTensorsReader r = SafeTensorsReader::open_dir(d.path.string());
    EXPECT_EQ(r.names(), std::vector<std::string>{"a"});
    EXPECT_NE(r.describe().find("model.safetensors"), std::string::npos);
}

TEST(SafeTensorsDir, ShardedIndex) {
    TempDir d;
    write_shard(d.file("model-00001-of-00002.safetensors"), {"a", "b"}, 1.0f);
    write_shard(d.file("model-00002-of-00002.safetensors"), {"c"}, 2.0f);
    // A stray single file must be ignored when the index exists (the index is authoritative).
    write_shard(d.file("model.safetensors"), {"zzz"}, 9.0f);
    write_file(d.file("model.safetensors.index.json"), R"({"metadata": {"total_size": 48}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors"}})");
    SafeTensorsReader r = SafeTensorsReader::open_dir(d.path.string());
    EXPECT_EQ(r.names(), (std::vector<std::string>{"a", "b", "c"}));
    float out[4];
    r.read_f32("c", {2, 2}, out);
    EXPECT_EQ(out[3], 2.0f);
    r.read_f32("a", {2, 2}, out);
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_NE(r.info("c").file.find("00002-of-00002"), std::string::npos);
    EXPECT_NE(r.describe().find("2 files"), std::string::npos) << r.describe();
    EXPECT_ERROR(r.info("zzz"), "'zzz'", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors");
}

TEST(SafeTensorsDir, BadIndexes) {
    TempDir d;
    write_shard(d.file("s1.safetensors"), {"a"}, 1.0f);
    write_shard(d.file("s2.safetensors"), {"b"}, 1.0f);
    const std::string index = d.file("model.safetensors.index.json");
    const std::string dir = d.path.string();

    write_file(index, R"({"weight_map": {"a": "s1.safetensors", "b": "missing.safetensors"}})");
    EXPECT_ERROR(SafeTensorsReader::open_dir(dir), "missing.safetensors", "'b'", index);
    write_file(index, R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
    EXPECT_ERROR(SafeTensorsReader::open_dir(dir), "'b'", "s1.safetensors", "not in it");
    write_file(index, R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "x": "s2.safetensors"}})");
    EXPECT_ERROR(SafeTensorsReader::open_dir(dir), "'b'");
    write_file(index, R"({"weight_map": {"a": "s2.safetensors", "b": "s1.safetensors"}})");
    EXPECT_ERROR(SafeTensorsReader::open_dir(dir), "'a'", "s2.safetensors", "found in");
    write_file(index, R"({"weight_map": {"a": "s1.safetensors",)");
    EXPECT_ERROR(SafeTensorsReader::open_dir(dir), index, "not valid JSON");
    write_file(index, R"({"metadata": {}})");
    EXPECT_ERROR(SafeTensorsReader::open_dir(dir), index, "weight_map");
    write_file(index, R"({"weight_map": {"a": 3}})");
    EXPECT_ERROR(SafeTensorsReader::open_dir(dir), index, "'a'");
    write_file(index, R"({"weight_map": {}})");
    EXPECT_ERROR(SafeTensorsReader::open_dir(dir), index, "empty");
}

TEST(SafeTensorsDir, NothingThere) {
    TempDir d;
    EXPECT_ERROR(SafeTensorsReader::open_dir(d.path.string()), d.path.string(), "model.safetensors",
                 "model.safetensors.index.json");
    EXPECT_ERROR(SafeTensorsReader(std::vector<std::string>{}), "no files");
}

TEST(SafeTensorsDir, DuplicateTensorAcrossFiles) {
    TempDir d;
    write_shard(d.file("x.safetensors"), {"a", "b"}, 1.0f);
    write_shard(d.file("y.safetensors"), {"b"}, 1.0f);
    EXPECT_ERROR(SafeTensorsReader({d.file("x.safetensors"), d.file("y.safetensors")}), "'b'", d.file("x.safetensors"),
                 d.file("y.safetensors"));
}

// ------------------------------------------------------------------ malformed files

class SafeTensorsBad : public ::testing::Test {
protected:
    TempDir dir;
    std::string path = dir.file("bad.safetensors");
    // Writes `bytes` and expects opening to fail with a message naming the file and `parts`.
    void expect_bad(const std::string& bytes, std::initializer_list<std::string> parts, int line) {
        write_file(path, bytes);
        SCOPED_TRACE("from line " + std::to_string(line));
        std::string m = test::expect_error([&] { SafeTensorsFile f(path); }, parts, __FILE__, line);
        EXPECT_NE(m.find(path), std::string::npos) << "file not named: " << m;
        // The reader must fail the same way.
        test::expect_error([&] { SafeTensorsReader r({path}); }, parts, __FILE__, line);
    }
};
#define EXPECT_BAD(bytes, ...) expect_bad(bytes, {__VA_ARGS__}, __LINE__)

TEST_F(SafeTensorsBad, ShortOrMissingFile) {
    EXPECT_BAD("", "0 bytes");
    EXPECT_BAD("abcde", "5 bytes");
    EXPECT_ERROR(SafeTensorsFile f(dir.file("nope.safetensors")), dir.file("nope.safetensors"));
}

TEST_F(SafeTensorsBad, HeaderLength) {
    EXPECT_BAD(raw_file("{}", "", 1000), "header length 1000", "exceeds");
    EXPECT_BAD(raw_file("{}", "", 1ull << 40), "header length", "absurd");
    // Not a safetensors file at all: the first 8 bytes of a text file read as a huge length.
    EXPECT_BAD("PK\x03\x04 this is a zip file", "header length");
}

TEST_F(SafeTensorsBad, HeaderJson) {
    EXPECT_BAD(raw_file("{\"a\": ", ""), "not valid JSON");
    EXPECT_BAD(raw_file("", ""), "not valid JSON");
    EXPECT_BAD(raw_file("[1, 2]", ""), "JSON object", "array");
    EXPECT_BAD(raw_file(R"({"w": [1]})", ""), "'w'", "object");
    EXPECT_BAD(raw_file(R"({"__metadata__": {"k": 3}})", ""), "__metadata__", "'k'");
    EXPECT_BAD(raw_file(R"({"__metadata__": [1]})", ""), "__metadata__");
}

TEST_F(SafeTensorsBad, Fields) {
    const std::string data(16, '\0');
    EXPECT_BAD(raw_file(R"({"w": {"shape": [4], "data_offsets": [0, 16]}})", data), "'w'", "'dtype'");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "data_offsets": [0, 16]}})", data), "'w'", "'shape'");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "shape": [4]}})", data), "'w'", "'data_offsets'");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}})", data), "'w'", "'F64'");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": 5, "shape": [4], "data_offsets": [0, 16]}})", data), "'w'", "dtype");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}})", data), "'w'", "shape");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", data), "'w'", "-4");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 16]}})", data), "'w'", "2.5");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0]}})", data), "'w'", "[0]");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16, 32]}})", data), "'w'",
               "data_offsets");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [-8, 8]}})", data), "'w'", "-8");
}

TEST_F(SafeTensorsBad, OffsetsAndSizes) {
    const std::string data(16, '\0');
    // Size mismatch: F32 [2, 2] needs 16 bytes, offsets span 12.
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})", data), "'w'",
               "needs 16 bytes", "span 12");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 16]}})", data), "'w'",
               "needs 8 bytes", "span 16");
    // Past the data section (16 bytes).
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", data), "'w'",
               "past the end", "16 bytes");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}})", data), "'w'",
               "past the end");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", data), "'w'", "begin > end");
    // Overflowing shape must not wrap around to a small size.
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4611686018427387904],
                         "data_offsets": [0, 0]}})", data), "'w'", "more than 2^64");
    EXPECT_BAD(raw_file(R"({"w": {"dtype": "F32", "shape": [1073741824, 4], "data_offsets": [0, 16]}})", data),
               "'w'", "needs 17179869184 bytes");
}

TEST_F(SafeTensorsBad, Overlap) {
    const std::string data(24, '\0');
    EXPECT_BAD(raw_file(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                           "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", data),
               "overlaps", "'a'", "'b'");
    EXPECT_BAD(raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                           "b": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})", data),
               "overlaps", "'a'", "'b'");
    // Touching is fine, and so is an empty tensor anywhere.
    write_file(path, raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                                  "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", data));
    SafeTensorsFile f(path);
    EXPECT_EQ(f.tensors().size(), 3u);
}

TEST_F(SafeTensorsBad, TruncatedData) {
    const std::vector<float> a(8, 1.0f), b(8, 2.0f);
    SafeTensorsWriter w;
    w.add_f32("first", {8}, a.data());
    w.add_f32("second", {8}, b.data());
    w.write(path);
    fs::resize_file(path, fs::file_size(path) - 5);
    std::string m = EXPECT_ERROR(SafeTensorsFile f(path), path, "'second'", "past the end");
    EXPECT_EQ(m.find("'first'"), std::string::npos) << m;
}

// A NaN or Inf in stored weights (or optimizer state) is named when read, with the file and the
// element, in every storage type: otherwise it surfaces steps later as a diverged loss.
TEST(SafeTensors, NonFiniteValuesAreNamedWhenRead) {
    TempDir dir;
    const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity()};
    for (DType storage : {DType::F32, DType::BF16, DType::F16}) {
        for (float bad : bad_values) {
            std::vector<float> ok(12, 0.5f), poisoned(12, 0.25f);
            poisoned[7] = bad;
            SafeTensorsWriter w;
            w.add_f32("model.norm.weight", {12}, ok.data(), storage);
            w.add_f32("model.layers.0.mlp.up_proj.weight", {3, 4}, poisoned.data(), storage);
            const std::string path = dir / "m.safetensors";
            w.write(path);
            SafeTensorsReader r({path});
            std::vector<float> out(12);
            EXPECT_NO_THROW(r.read_finite_f32("model.norm.weight", {12}, out.data()));
            EXPECT_NO_THROW(r.read_f32("model.layers.0.mlp.up_proj.weight", {3, 4}, out.data()));  // a plain conversion
            try {
                r.read_finite_f32("model.layers.0.mlp.up_proj.weight", {3, 4}, out.data());
                ADD_FAILURE() << "a non-finite value was read without an error";
            } catch (const Error& e) {
                const std::string msg = e.what();
                EXPECT_TRUE(Contains(msg, "model.layers.0.mlp.up_proj.weight")) << msg;
                EXPECT_TRUE(Contains(msg, path)) << msg;
                EXPECT_TRUE(Contains(msg, "element 7 of 12")) << msg;
            }
        }
    }
}

}  // namespace
}  // namespace qtrain
