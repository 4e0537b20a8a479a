// BIN.TOK: the byte layout must match llm.q's exactly (users bring existing data), and a foreign,
// short or corrupt file must fail loudly with the file name instead of training on garbage.
#include "io/token_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/files.h"
#include "test_util.h"

namespace qtrain {
namespace {

using test::TempDir;
using test::write_file;
namespace fs = std::filesystem;

// A hand-made file: header ints as given, then the token ints, then raw trailing bytes.
std::string raw_token_file(std::vector<int32_t> header, const std::vector<int32_t>& tokens,
                           const std::string& tail = "", const char* magic = "BIN.TOK\n") {
    header.resize(256, 0);
    std::string out(1024, '\0');
    std::memcpy(out.data(), header.data(), 1024);
    std::memcpy(out.data(), magic, 8);
    out.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
    return out + tail;
}

int32_t header_int(const std::vector<uint8_t>& bytes, int i) {
    int32_t v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    return v;
}

void bad_doc_field(TempDir& d) {
    write_file(d.file("bad7.bin"), raw_token_file({0, 0, 2, 4, 1, 10, 0, 3}, {1}));
    TokenFile f(d.file("bad7.bin"));
}

TEST(TokenFile, RoundTripWithoutMasks) {
    TempDir d;
    std::vector<int32_t> tokens(100);
    for (int i = 0; i < 100; ++i) tokens[i] = (i * 7919) % 1000;
    const std::string path = d.file("train.bin");
    write_token_file(path, tokens, 1000);
    EXPECT_EQ(d.count(), 1) << "temporary file left behind";

    const auto bytes = read_binary_file(path);
    ASSERT_EQ(bytes.size(), 1024u + 400u);
    EXPECT_EQ(std::memcmp(bytes.data(), "BIN.TOK\n", 8), 0);
    EXPECT_EQ(header_int(bytes, 2), 2);
    EXPECT_EQ(header_int(bytes, 3), 4);
    EXPECT_EQ(header_int(bytes, 4), 100);
    EXPECT_EQ(header_int(bytes, 5), 1000);
    EXPECT_EQ(header_int(bytes, 6), 0);
    for (int i = 7; i < 256; ++i) EXPECT_EQ(header_int(bytes, i), 0) << i;

    TokenFile f(path);
    EXPECT_EQ(f.path(), path);
    EXPECT_EQ(f.size(), 100);
    EXPECT_EQ(f.header().version, 2);
    EXPECT_EQ(f.header().vocab_size, 1000);
    EXPECT_FALSE(f.has_masks());
    EXPECT_EQ(std::vector<int32_t>(f.tokens(), f.tokens() + 100), tokens);
    for (int i = 0; i < 100; ++i) EXPECT_TRUE(f.mask(i));
    f.validate_tokens(1000, "vocab");
}

TEST(TokenFile, RoundTripWithMasks) {
    TempDir d;
    const int n = 13;  // not a multiple of 8: the last mask byte is partial
    std::vector<int32_t> tokens(n);
    std::vector<uint8_t> mask(n);
    for (int i = 0; i < n; ++i) {
        tokens[i] = 50 + i;
        mask[i] = static_cast<uint8_t>((i % 3 == 0) ? 1 : 0);
    }
    mask[9] = 7;  // any nonzero byte means "train"
    const std::string path = d.file("sft.bin");
    write_token_file(path, tokens, 151936, &mask);

    const auto bytes = read_binary_file(path);
    ASSERT_EQ(bytes.size(), 1024u + 4 * n + 2);
    EXPECT_EQ(header_int(bytes, 6), 1);
    // LSB first: token i is bit (i % 8) of byte i / 8. Tokens 0,3,6 -> 0b01001001; 9,12 -> 0b00010010.
    EXPECT_EQ(bytes[1024 + 4 * n], 0x49);
    EXPECT_EQ(bytes[1024 + 4 * n + 1], 0x12);

    TokenFile f(path);
    EXPECT_TRUE(f.has_masks());
    EXPECT_EQ(f.size(), n);
    for (int i = 0; i < n; ++i) EXPECT_EQ(f.mask(i), mask[i] != 0) << i;
    EXPECT_EQ(std::vector<int32_t>(f.tokens(), f.tokens() + n), tokens);
}

// Document starts (qtrain's header field [7]): one bit per token after the masks; the first token
// always starts a document; a hand-made file with the same bytes reads the same.
TEST(TokenFile, RoundTripWithDocumentStarts) {
    TempDir d;
    const int n = 11;
    std::vector<int32_t> tokens(n);
    std::vector<uint8_t> mask(n, 0);
    for (int i = 0; i < n; ++i) tokens[i] = 10 + i;
    mask[2] = mask[3] = 1;
    const std::vector<int64_t> starts = {4, 9};  // documents [0,4) [4,9) [9,11); 0 is implied
    write_token_file(d.file("chat.bin"), tokens, 100, &mask, &starts);
    const auto bytes = read_binary_file(d.file("chat.bin"));
    ASSERT_EQ(bytes.size(), 1024u + 4 * n + 2 + 2);
    EXPECT_EQ(header_int(bytes, 6), 1);
    EXPECT_EQ(header_int(bytes, 7), 1);
    EXPECT_EQ(bytes[1024 + 4 * n], 0x0c);      // mask: tokens 2, 3
    EXPECT_EQ(bytes[1024 + 4 * n + 2], 0x11);  // starts: tokens 0, 4
    EXPECT_EQ(bytes[1024 + 4 * n + 3], 0x02);  // token 9
    TokenFile f(d.file("chat.bin"));
    EXPECT_TRUE(f.has_document_starts());
    for (int i = 0; i < n; ++i) EXPECT_EQ(f.document_start(i), i == 0 || i == 4 || i == 9) << i;
    for (int i = 0; i < n; ++i) EXPECT_EQ(f.mask(i), i == 2 || i == 3) << i;

    // Without masks the starts follow the tokens directly; a start after the last token is dropped.
    TokenFileWriter w(d.file("docs.bin"), 100, false, true);
    w.append(tokens.data(), 3);
    w.start_document();
    w.append(tokens.data(), 5);
    w.start_document();
    w.finish();
    write_file(d.file("hand.bin"), raw_token_file({0, 0, 2, 4, 8, 100, 0, 1}, {10, 11, 12, 10, 11, 12, 13, 14},
                                                   std::string("\x09", 1)));
    for (const char* name : {"docs.bin", "hand.bin"}) {
        TokenFile g(d.file(name));
        EXPECT_FALSE(g.has_masks());
        ASSERT_EQ(g.size(), 8);
        for (int i = 0; i < 8; ++i) EXPECT_EQ(g.document_start(i), i == 0 || i == 3) << name << " " << i;
    }
    TokenFile plain(d.file("hand.bin"));
    EXPECT_ERROR(bad_doc_field(d), "has-document-starts", "3");
}

TEST(TokenFile, AppendsInPiecesEqualOneAppend) {
    TempDir d;
    std::vector<int32_t> tokens(21);
    std::vector<uint8_t> mask(21);
    for (int i = 0; i < 21; ++i) {
        tokens[i] = i;
        mask[i] = static_cast<uint8_t>(i % 2 == 0 || i == 7);
    }
    write_token_file(d.file("one.bin"), tokens, 100, &mask);
    {
        TokenFileWriter w(d.file("pieces.bin"), 100, true);
        w.append(tokens.data(), 5, mask.data());  // pieces straddle mask bytes
        w.append(tokens.data() + 5, 0, mask.data() + 5);
        w.append(tokens.data() + 5, 6, mask.data() + 5);
        w.append(tokens.data() + 11, 10, mask.data() + 11);
        EXPECT_EQ(w.num_tokens(), 21);
        w.finish();
        EXPECT_ERROR(w.finish(), "pieces.bin");
        EXPECT_ERROR(w.append(tokens.data(), 1, mask.data()), "pieces.bin");
    }
    EXPECT_EQ(read_binary_file(d.file("one.bin")), read_binary_file(d.file("pieces.bin")));
}

TEST(TokenFile, EmptyFileAndMove) {
    TempDir d;
    write_token_file(d.file("empty.bin"), {}, 10);
    TokenFile e(d.file("empty.bin"));
    EXPECT_EQ(e.size(), 0);
    e.validate_tokens(10, "vocab");

    write_token_file(d.file("a.bin"), {1, 2, 3}, 10);
    TokenFile a(d.file("a.bin"));
    TokenFile b(std::move(a));
    EXPECT_EQ(b.size(), 3);
    EXPECT_EQ(b.tokens()[2], 3);
    std::vector<TokenFile> files;  // the loader keeps them in a vector
    files.push_back(std::move(b));
    files.emplace_back(d.file("empty.bin"));
    EXPECT_EQ(files[0].tokens()[0], 1);
}

TEST(TokenFile, ReadsVersion1) {
    TempDir d;
    // v1: fields [5] and [6] did not exist; whatever is there is ignored.
    write_file(d.file("v1.bin"), raw_token_file({0, 0, 1, 4, 3, 77, 1}, {5, 6, 7}));
    TokenFile f(d.file("v1.bin"));
    EXPECT_EQ(f.header().version, 1);
    EXPECT_EQ(f.header().vocab_size, 0);
    EXPECT_FALSE(f.has_masks());
    EXPECT_EQ(f.size(), 3);
    EXPECT_EQ(f.tokens()[1], 6);
}

TEST(TokenFile, ReadsHandMadeV2WithMasks) {
    TempDir d;
    // Written independently of our writer: 10 tokens, mask bytes 0xff, 0x02 (tokens 0-7 and 9).
    write_file(d.file("v2.bin"), raw_token_file({0, 0, 2, 4, 10, 32000, 1}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9},
                                                 std::string("\xff\x02", 2)));
    TokenFile f(d.file("v2.bin"));
    EXPECT_EQ(f.header().vocab_size, 32000);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(f.mask(i), i != 8) << i;
}

TEST(TokenFile, BadFilesNameTheFile) {
    TempDir d;
    const std::string p = d.file("bad.bin");
    auto bad = [&](const std::string& bytes) {
        write_file(p, bytes);
        TokenFile f(p);
    };
    EXPECT_ERROR(bad(raw_token_file({0, 0, 2, 4, 1, 10, 0}, {1}, "", "BIN.TOX\n")), p, "BIN.TOK");
    EXPECT_ERROR(bad(raw_token_file({0, 0, 3, 4, 1, 10, 0}, {1})), p, "version 3");
    EXPECT_ERROR(bad(raw_token_file({0, 0, 0, 4, 1, 10, 0}, {1})), p, "version 0");
    EXPECT_ERROR(bad(raw_token_file({0, 0, 2, 2, 1, 10, 0}, {1})), p, "2 bytes per token");
    EXPECT_ERROR(bad(raw_token_file({0, 0, 2, 4, -1, 10, 0}, {})), p, "-1");
    EXPECT_ERROR(bad(raw_token_file({0, 0, 2, 4, 1, 10, 5}, {1})), p, "has-masks", "5");
    EXPECT_ERROR(bad(raw_token_file({0, 0, 2, 4, 1, -10, 0}, {1})), p, "-10");
    EXPECT_ERROR(bad(std::string(100, 'x')), p, "100 bytes", "1024");
    EXPECT_ERROR(bad(""), p, "0 bytes");
    // Header says 10 tokens, the file holds 9: sizes 1064 expected vs 1060 actual.
    EXPECT_ERROR(bad(raw_token_file({0, 0, 2, 4, 10, 100, 0}, std::vector<int32_t>(9, 1))), p, "1060", "1064",
                 "10 tokens");
    // Masks announced but missing; and trailing junk.
    EXPECT_ERROR(bad(raw_token_file({0, 0, 2, 4, 10, 100, 1}, std::vector<int32_t>(10, 1))), p, "1064", "1066",
                 "masks");
    EXPECT_ERROR(bad(raw_token_file({0, 0, 2, 4, 1, 100, 0}, {1}, "junk")), p, "1032", "1028");
    EXPECT_ERROR(TokenFile f(d.file("missing.bin")), d.file("missing.bin"));
}

TEST(TokenFile, ValidateTokens) {
    TempDir d;
    const std::string p = d.file("t.bin");
    write_token_file(p, {0, 1, 2, 3, 4, 1000, 6}, 0);  // vocab 0 = unknown: the writer cannot check
    TokenFile f(p);
    EXPECT_ERROR(f.validate_tokens(1000, "the model's vocab_size"), p, "token 1000", "index 5", "1000)",
                 "the model's vocab_size");
    f.validate_tokens(1001, "the model's vocab_size");

    write_token_file(d.file("neg.bin"), {3, -7}, 0);
    TokenFile g(d.file("neg.bin"));
    EXPECT_ERROR(g.validate_tokens(10, "vocab"), d.file("neg.bin"), "token -7", "index 1");
}

// any_trained answers for exactly [begin, end): every single trained position of a 70-token file
// (bits across byte boundaries, partial first and last bytes) against the per-token answer.
TEST(TokenFile, AnyTrainedLooksAtExactlyTheRange) {
    TempDir d;
    const int n = 70;
    const std::vector<int32_t> tokens(n, 3);
    for (int trained : {-1, 0, 7, 8, 9, 15, 16, 63, 69}) {
        std::vector<uint8_t> mask(n, 0);
        if (trained >= 0) mask[trained] = 1;
        const std::string path = d / "m.bin";
        write_token_file(path, tokens, 10, &mask);
        const TokenFile f(path);
        for (int begin = 0; begin <= n; ++begin)
            for (int end = begin; end <= n + 3; ++end)
                ASSERT_EQ(f.any_trained(begin, end), trained >= begin && trained < std::min(end, n))
                    << "trained " << trained << " range [" << begin << ", " << end << ")";
    }
    write_token_file(d / "plain.bin", tokens, 10);
    EXPECT_TRUE(TokenFile(d / "plain.bin").any_trained(1, 2)) << "without masks every token is trained";
    EXPECT_FALSE(TokenFile(d / "plain.bin").any_trained(5, 5));
}

TEST(TokenFileWriter, RejectsBadInput) {
    TempDir d;
    const std::string p = d.file("w.bin");
    EXPECT_ERROR(write_token_file(p, {1, 2, 10}, 10), p, "token 10", "index 2");
    EXPECT_ERROR(write_token_file(p, {1, -2}, 10), p, "token -2", "index 1");
    EXPECT_FALSE(fs::exists(p));
    EXPECT_EQ(d.count(), 0) << "temporary file left behind";

    const std::vector<uint8_t> short_mask(2, 1);
    EXPECT_ERROR(write_token_file(p, {1, 2, 3}, 10, &short_mask), p, "3 tokens", "2 mask");
    const int32_t t[2] = {1, 2};
    const uint8_t m[2] = {1, 1};
    TokenFileWriter with(d.file("m.bin"), 10, true);
    EXPECT_ERROR(with.append(t, 2), "m.bin", "mask");
    TokenFileWriter without(d.file("n.bin"), 10, false);
    EXPECT_ERROR(without.append(t, 2, m), "n.bin", "mask");
    EXPECT_ERROR(TokenFileWriter(d.file("v.bin"), -1, false), "v.bin", "-1");
}

TEST(TokenFileWriter, AbandonedWriterLeavesNothing) {
    TempDir d;
    {
        TokenFileWriter w(d.file("out.bin"), 10, false);
        const int32_t t[3] = {1, 2, 3};
        w.append(t, 3);
        EXPECT_EQ(d.count(), 1);  // the temp file, not out.bin
        EXPECT_FALSE(fs::exists(d.file("out.bin")));
    }
    EXPECT_EQ(d.count(), 0);
}

}  // namespace
}  // namespace qtrain
