// NFC normalization (Unicode normalization form C), as the tokenizer.json "NFC" normalizer of HF
// `tokenizers` does it. Hand-written over generated tables (unicode_tables.h) instead of ICU's
// normalizer2: HF's NFC data is older than any ICU we could link (combining classes of Unicode 9),
// so ICU would differ on newer marks, and the tables keep the build free of dependencies.
#pragma once

#include <string>
#include <string_view>

namespace qtrain {

// Returns the NFC form of valid UTF-8 `text`: a view of `text` itself when it is already NFC
// (almost all text; checked in one pass), else a view of `storage`, which receives the result.
std::string_view nfc(std::string_view text, std::string& storage);

}  // namespace qtrain
