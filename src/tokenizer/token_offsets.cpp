// Tokenizer::encode_with_offsets: the ids of encode() and where each token comes from in the text,
// for chat loss masks (a token is trained when any of its characters is; chat_mask.h).
//
// Byte-level BPE keeps every byte of a piece, so within a piece the tokens' byte lengths add up, and
// pieces and added-token matches are views of the text they were cut from. The one step that moves
// bytes is NFC: where it changed the text, normalized positions are mapped back run by run — a run is
// a character NFC starts afresh at (unicode::kNfcBoundary) and the non-starters after it; NFC of the
// whole is NFC of each run. A run NFC left alone maps byte for byte; a run it changed maps as a whole
// (every token of it covers all its original characters, as HF's alignments give a composed
// character the characters it came from).
#include <algorithm>

#include "core/error.h"
#include "tokenizer/nfc.h"
#include "tokenizer/encode_context.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_tables.h"
#include "tokenizer/utf8.h"

namespace qtrain {

namespace {

// Normalized position -> original position of one segment.
class NfcAlignment {
public:
    // `normalized` is nfc(original): a view of `original` itself when NFC changed nothing.
    NfcAlignment(std::string_view original, std::string_view normalized) {
        if (normalized.data() == original.data()) return;  // identity
        std::string storage, joined;
        std::size_t i = 0;
        while (i < original.size()) {
            std::size_t end = i + char_len(original, i);
            while (end < original.size() && !is_boundary(original, end)) end += char_len(original, end);
            const std::string_view run = original.substr(i, end - i);
            const std::string_view norm = nfc(run, storage);
            runs_.push_back({i, joined.size(), norm.data() == run.data()});
            joined.append(norm);
            i = end;
        }
        runs_.push_back({original.size(), joined.size(), true});
        // NFC restarts at every boundary, so the runs must add up to the whole; if they did not, the
        // segment maps as one run (coarse, never wrong about which characters a token touches).
        if (joined != normalized) runs_ = {{0, 0, false}, {original.size(), normalized.size(), true}};
    }

    std::size_t begin(std::size_t p) const {
        if (runs_.empty()) return p;
        auto k = std::upper_bound(runs_.begin(), runs_.end(), p, [](std::size_t v, const Run& r) { return v < r.norm; }) - 1;
        return k->same ? k->orig + (p - k->norm) : k->orig;
    }
    std::size_t end(std::size_t p) const {
        if (runs_.empty()) return p;
        // the run holding the byte before p
        auto k = std::lower_bound(runs_.begin(), runs_.end(), p, [](const Run& r, std::size_t v) { return r.norm < v; }) - 1;
        if (k < runs_.begin()) return 0;
        return k->same ? k->orig + (p - k->norm) : (k + 1)->orig;
    }

private:
    struct Run {
        std::size_t orig, norm;  // where the run starts in the original and in the normalized text
        bool same;               // NFC left it alone
    };

    static std::size_t char_len(std::string_view s, std::size_t i) {
        const auto c = static_cast<unsigned char>(s[i]);
        return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    }
    static bool is_boundary(std::string_view s, std::size_t i) {
        if (static_cast<unsigned char>(s[i]) < 0x80) return true;
        int len;
        return unicode::properties(utf8::decode(s.data() + i, len)) & unicode::kNfcBoundary;
    }

    std::vector<Run> runs_;
};

}  // namespace

void Tokenizer::encode_with_offsets(std::string_view text, std::vector<int32_t>& ids,
                                    std::vector<TokenOffset>& offsets, SpecialTokens mode) const {
    QT_CHECK(utf8::valid_prefix(text) == text.size(), "encode_with_offsets: the text is not valid UTF-8 (byte ",
             utf8::valid_prefix(text), ")");
    QT_CHECK(text.size() < 0xFFFFFFFFu, "encode_with_offsets: a text of ", text.size(), " bytes is too long");
    const std::size_t first = ids.size();
    auto add = [&](int32_t id, std::size_t begin, std::size_t end) {
        ids.push_back(id);
        offsets.push_back({static_cast<uint32_t>(begin), static_cast<uint32_t>(end)});
    };
    auto segment = [&](std::string_view seg) {
        if (seg.empty()) return;
        const std::size_t base = static_cast<std::size_t>(seg.data() - text.data());
        std::string storage;
        const std::string_view normalized = nfc_ ? nfc(seg, storage) : seg;
        const NfcAlignment align(seg, normalized);
        auto pieces_of = [&](std::string_view part) {
            EncodeContext& ctx = context();
            std::vector<std::string_view> pieces;  // (ctx.pieces is reused by encode_pieces)
            pretokenize(part, *split_, pieces);
            std::vector<int32_t> piece_ids;
            for (const std::string_view piece : pieces) {
                piece_ids.clear();
                encode_piece(piece, ctx, piece_ids);
                std::size_t pos = static_cast<std::size_t>(piece.data() - normalized.data());
                for (const int32_t id : piece_ids) {
                    const std::size_t len = id < bpe_->size() ? bpe_->token(id).size() : by_id_[id]->size();
                    add(id, base + align.begin(pos), base + align.end(pos + len));
                    pos += len;
                }
                QT_CHECK(pos == static_cast<std::size_t>(piece.data() - normalized.data()) + piece.size(),
                         "encode_with_offsets: the tokens of a piece do not spell it");
            }
        };
        split_added(normalized_matcher_, normalized, mode, pieces_of, [&](int32_t id, std::string_view match) {
            const auto pos = static_cast<std::size_t>(match.data() - normalized.data());
            add(id, base + align.begin(pos), base + align.end(pos + match.size()));
        });
    };
    split_added(raw_matcher_, text, mode, segment, [&](int32_t id, std::string_view match) {
        const auto pos = static_cast<std::size_t>(match.data() - text.data());
        add(id, pos, pos + match.size());
    });
    QT_CHECK(offsets.size() == ids.size() && ids.size() >= first, "encode_with_offsets: offsets out of step");
}

}  // namespace qtrain
