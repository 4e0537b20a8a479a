// Checkpoint checksums: XXH3-64 of whole files, streamed in chunks. The expected values are what
// `xxhsum -H3` (xxHash's own command-line tool) prints for the same bytes, so the recorded sums
// stay comparable with that tool and cannot drift with a change of chunking.
#include "core/checksum.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "test_util.h"

namespace qtrain {
namespace {

using test::TempDir;

TEST(Checksum, MatchesXxhsumOnSmallFiles) {
    TempDir d;
    test::write_file(d / "empty", "");
    test::write_file(d / "abc", "abc");
    EXPECT_EQ(checksum_hex(checksum_file(d / "empty").xxh3), "2d06800538d394c2");
    const FileChecksum abc = checksum_file(d / "abc");
    EXPECT_EQ(abc.bytes, 3u);
    EXPECT_EQ(checksum_hex(abc.xxh3), "78af5f94892f3950");
}

// Larger than several read chunks (4 MiB) and not a multiple of one: the streamed sum is the whole file's.
TEST(Checksum, MatchesXxhsumAcrossChunks) {
    TempDir d;
    const std::size_t n = 40u * 1024 * 1024 + 12345;
    std::string bytes(n, '\0');
    for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>((i * 31 + (i >> 20)) & 255);
    test::write_file(d / "big", bytes);
    const FileChecksum c = checksum_file(d / "big");
    EXPECT_EQ(c.bytes, n);
    EXPECT_EQ(checksum_hex(c.xxh3), "9d8e264ef987e5ca");
}

TEST(Checksum, MissingFileIsAnErrorNamingIt) {
    TempDir d;
    EXPECT_ERROR(checksum_file(d / "nope.safetensors"), "nope.safetensors");
}

TEST(Checksum, HexRoundTripsAndRejectsOtherText) {
    EXPECT_EQ(parse_checksum_hex("78af5f94892f3950", "x"), 0x78af5f94892f3950ull);
    EXPECT_EQ(checksum_hex(1), "0000000000000001");
    EXPECT_ERROR(parse_checksum_hex("78AF5F94892F3950", "state.json"), "state.json", "78AF5F94892F3950");
    EXPECT_ERROR(parse_checksum_hex("abc", "state.json"), "state.json");
}

}  // namespace
}  // namespace qtrain
