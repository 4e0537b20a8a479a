// NFC as HF `tokenizers` does it, including its quirks (older Unicode data than Python's).
#include <gtest/gtest.h>

#include "tokenizer/nfc.h"
#include "tokenizer/unicode_tables.h"

namespace qtrain {
namespace {

std::string nfc_of(std::string_view s) {
    std::string storage;
    return std::string(nfc(s, storage));
}

TEST(Nfc, NormalTextIsReturnedAsIs) {
    const std::string text = "ASCII, caf\u00e9, \u4e2d\u6587, \ud55c\uad6d\uc5b4, \U0001F600";
    std::string storage;
    const std::string_view out = nfc(text, storage);
    EXPECT_EQ(out.data(), text.data());  // no copy
    EXPECT_EQ(out.size(), text.size());
}

TEST(Nfc, ComposesReordersAndMapsSingletons) {
    EXPECT_EQ(nfc_of("e\u0301"), "\u00e9");
    EXPECT_EQ(nfc_of("a\u0301\u0323"), "\u1ea1\u0301");           // dot below first, then compose
    EXPECT_EQ(nfc_of("\u1100\u1161\u11a8"), "\uac01");            // Hangul jamo
    EXPECT_EQ(nfc_of("\u212b"), "\u00c5");                        // Angstrom sign -> A ring
    EXPECT_EQ(nfc_of("\u0958"), "\u0915\u093c");                  // composition exclusion
    EXPECT_EQ(nfc_of("x\u0301y e\u0301"), "x\u0301y \u00e9");
    EXPECT_EQ(nfc_of("\u0301start"), "\u0301start");              // leading mark stays
}

TEST(Nfc, FollowsTheReferenceDataNotPython) {
    // A Unicode 13 composition that Python's NFC makes and HF's (older data) does not.
    EXPECT_EQ(nfc_of("\U00011935\U00011930"), "\U00011935\U00011930");
    // A Unicode 14 mark (class 230) that HF's data gives class 0: it is not reordered.
    EXPECT_EQ(nfc_of("a\u0898\u0316"), "a\u0898\u0316");
}

TEST(UnicodeTables, AsciiClasses) {
    using namespace unicode;
    EXPECT_EQ(properties('a') & (kLetter | kNumber | kSpace), kLetter);
    EXPECT_EQ(properties('7') & (kLetter | kNumber | kSpace), kNumber);
    EXPECT_EQ(properties(' ') & (kLetter | kNumber | kSpace), kSpace);
    EXPECT_EQ(properties(0x1C) & kSpace, 0);  // Python's isspace() says yes; the regex says no
    for (char32_t c = 0; c < 0x300; ++c) EXPECT_TRUE(properties(c) & kNfcBoundary) << static_cast<uint32_t>(c);
}

}  // namespace
}  // namespace qtrain
