// NFC in two speeds. The scan looks up one property bit per code point: text made only of NFC
// boundaries (ASCII, CJK, Hangul syllables, precomposed Latin...) is returned untouched. Around
// any other code point it normalizes the smallest independent region — from the last boundary
// before it to the next boundary after it — by the textbook algorithm: full canonical
// decomposition, canonical reordering, canonical composition (Unicode UAX #15).
#include "tokenizer/nfc.h"

#include <algorithm>
#include <vector>

#include "tokenizer/unicode_tables.h"
#include "tokenizer/utf8.h"

namespace qtrain {
namespace {

bool is_boundary(char32_t cp) { return unicode::properties(cp) & unicode::kNfcBoundary; }

void normalize_region(std::string_view region, std::string& out) {
    thread_local std::vector<char32_t> chars;
    thread_local std::vector<uint8_t> classes;
    chars.clear();
    for (std::size_t i = 0; i < region.size();) {
        int len;
        const char32_t cp = utf8::decode(region.data() + i, len);
        i += static_cast<std::size_t>(len);
        char32_t parts[4];
        const int n = unicode::decompose(cp, parts);
        if (n == 0) {
            chars.push_back(cp);
        } else {
            chars.insert(chars.end(), parts, parts + n);
        }
    }
    classes.resize(chars.size());
    for (std::size_t i = 0; i < chars.size(); ++i) classes[i] = unicode::combining_class(chars[i]);

    // Canonical ordering: a stable sort by combining class of every run of non-starters.
    for (std::size_t i = 1; i < chars.size(); ++i) {
        for (std::size_t j = i; j > 0 && classes[j] != 0 && classes[j - 1] > classes[j]; --j) {
            std::swap(chars[j], chars[j - 1]);
            std::swap(classes[j], classes[j - 1]);
        }
    }

    // Canonical composition: each character joins the last starter unless something between them
    // blocks it (a starter, or a mark of the same or a higher class).
    std::size_t kept = 0;
    std::size_t starter = 0;
    bool have_starter = false;
    int last_class = -1;  // class of the last kept character after the starter; -1: none
    for (std::size_t i = 0; i < chars.size(); ++i) {
        const char32_t c = chars[i];
        const int cls = classes[i];
        if (have_starter && (last_class < 0 || (last_class != 0 && last_class < cls))) {
            const char32_t composite = unicode::compose(chars[starter], c);
            if (composite != 0) {
                chars[starter] = composite;
                continue;
            }
        }
        if (cls == 0) {
            starter = kept;
            have_starter = true;
            last_class = -1;
        } else {
            last_class = cls;
        }
        chars[kept++] = c;
    }
    for (std::size_t i = 0; i < kept; ++i) utf8::append(out, chars[i]);
}

}  // namespace

std::string_view nfc(std::string_view text, std::string& storage) {
    const std::size_t n = text.size();
    bool changed = false;
    std::size_t copied = 0;         // with `changed`: text[0, copied) is already in storage
    std::size_t last_boundary = 0;  // start of the last boundary seen (or of the text)
    std::string region_out;
    std::size_t i = 0;
    while (i < n) {
        if (static_cast<unsigned char>(text[i]) < 0x80) {
            last_boundary = i++;
            continue;
        }
        int len;
        const char32_t cp = utf8::decode(text.data() + i, len);
        if (is_boundary(cp)) {
            last_boundary = i;
            i += static_cast<std::size_t>(len);
            continue;
        }
        const std::size_t start = std::max(last_boundary, copied);
        std::size_t end = i + static_cast<std::size_t>(len);
        while (end < n) {
            const char32_t next = utf8::decode(text.data() + end, len);
            if (is_boundary(next)) break;
            end += static_cast<std::size_t>(len);
        }
        const std::string_view region = text.substr(start, end - start);
        region_out.clear();
        normalize_region(region, region_out);
        if (changed || region_out != region) {
            if (!changed) storage.clear();
            storage.append(text.data() + copied, start - copied);
            storage.append(region_out);
            copied = end;
            changed = true;
        }
        last_boundary = end;
        i = end;
    }
    if (!changed) return text;
    storage.append(text.data() + copied, n - copied);
    return storage;
}

}  // namespace qtrain
