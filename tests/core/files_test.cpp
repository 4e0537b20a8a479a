// File helpers: size parsing for --memory-limit, globbing for --train-file, atomic writes.
#include "core/files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"

namespace qtrain {
namespace {

namespace fs = std::filesystem;

using test::TempDir;

TEST(ParseBytes, Units) {
    EXPECT_EQ(parse_bytes("24GiB", "--memory-limit"), 24ull << 30);
    EXPECT_EQ(parse_bytes("512MiB", "--memory-limit"), 512ull << 20);
    EXPECT_EQ(parse_bytes("1.5GB", "--memory-limit"), 1500000000ull);
    EXPECT_EQ(parse_bytes("1000000", "--memory-limit"), 1000000ull);
    EXPECT_EQ(parse_bytes("4 KiB", "--x"), 4096ull);
    EXPECT_EQ(parse_bytes("2gib", "--x"), 2ull << 30);
    EXPECT_EQ(parse_bytes("1.5GiB", "--x"), 3ull << 29);
    EXPECT_EQ(parse_bytes("3TB", "--x"), 3000000000000ull);
    EXPECT_EQ(parse_bytes("7B", "--x"), 7ull);
}

TEST(ParseBytes, BadInputNamesFlag) {
    EXPECT_ERROR(parse_bytes("10XB", "--memory-limit"), "--memory-limit", "unknown size unit", "10XB");
    EXPECT_ERROR(parse_bytes("GiB", "--memory-limit"), "--memory-limit", "'GiB'");
    EXPECT_ERROR(parse_bytes("", "--memory-limit"), "--memory-limit");
    EXPECT_ERROR(parse_bytes("-5GiB", "--memory-limit"), "--memory-limit");
}

TEST(ExpandGlob, SortedFilesOnly) {
    TempDir d;
    test::write_file(d.file("b.bin"), "x");
    test::write_file(d.file("a.bin"), "x");
    test::write_file(d.file("c.txt"), "x");
    fs::create_directory(d.path / "dir.bin");  // directories never count as data files
    auto files = expand_glob(d.file("*.bin"), "--train-file");
    ASSERT_EQ(files.size(), 2u);
    EXPECT_EQ(files[0], d.file("a.bin"));
    EXPECT_EQ(files[1], d.file("b.bin"));

    files = expand_glob(d.file("{c.txt,a.bin}"), "--train-file");
    ASSERT_EQ(files.size(), 2u);
    EXPECT_EQ(files[0], d.file("a.bin"));
    EXPECT_EQ(files[1], d.file("c.txt"));

    files = expand_glob(d.file("?.txt"), "--train-file");
    ASSERT_EQ(files.size(), 1u);
    // No wildcard: the file itself.
    EXPECT_EQ(expand_glob(d.file("c.txt"), "--eval-file"), std::vector<std::string>{d.file("c.txt")});
}

TEST(ExpandGlob, NoMatchNamesFlagAndPattern) {
    TempDir d;
    const std::string pattern = d.file("*.tok");
    EXPECT_ERROR(expand_glob(pattern, "--train-file"), "--train-file", pattern);
    EXPECT_ERROR(expand_glob(d.file("missing.bin"), "--eval-file"), "--eval-file", "missing.bin");
    EXPECT_ERROR(expand_glob("", "--train-file"), "--train-file");
}

TEST(WriteFileAtomic, WritesCreatesAndReplaces) {
    TempDir d;
    const std::string path = d.file("sub/dir/out.bin");  // parents are created
    const std::vector<uint8_t> data = {0, 1, 2, 255, 7};
    write_file_atomic(path, data.data(), data.size());
    EXPECT_EQ(read_binary_file(path), data);

    write_text_file_atomic(path, "replaced");
    EXPECT_EQ(read_text_file(path), "replaced");

    write_file_atomic(path, nullptr, 0);
    EXPECT_EQ(fs::file_size(path), 0u);

    // Nothing but the target is left behind (no temporary files).
    int entries = 0;
    for (const auto& e : fs::directory_iterator(d.path / "sub" / "dir")) {
        ++entries;
        EXPECT_EQ(e.path().filename(), "out.bin");
    }
    EXPECT_EQ(entries, 1);
}

TEST(WriteFileAtomic, FailureNamesPath) {
    TempDir d;
    // The target is a non-empty directory: the rename cannot replace it.
    fs::create_directories(d.path / "target" / "inner");
    EXPECT_ERROR(write_text_file_atomic(d.file("target"), "x"), d.file("target"));
}

TEST(ReadFile, MissingNamesPath) {
    TempDir d;
    EXPECT_ERROR(read_text_file(d.file("nope.txt")), "nope.txt");
    EXPECT_ERROR(read_binary_file(d.file("nope.bin")), "nope.bin");
}

TEST(HumanBytes, Formats) {
    EXPECT_EQ(human_bytes(0), "0 B");
    EXPECT_EQ(human_bytes(1023), "1023 B");
    EXPECT_EQ(human_bytes(1536), "1.50 KiB");
    EXPECT_EQ(human_bytes(24ull << 30), "24.00 GiB");
}

}  // namespace
}  // namespace qtrain

TEST(ParseBytesMalformed, RejectsBadNumbersWithTheFlagName) {
    for (const char* bad : {".", "..5", "1.2.3GiB", "GiB", "", "99999999999999TiB"}) {
        try {
            qtrain::parse_bytes(bad, "--memory-limit");
            ADD_FAILURE() << "accepted '" << bad << "'";
        } catch (const qtrain::Error& e) {
            EXPECT_NE(std::string(e.what()).find("--memory-limit"), std::string::npos) << e.what();
        }
    }
}
