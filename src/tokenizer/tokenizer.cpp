#include "tokenizer/tokenizer.h"

#include <atomic>
#include <cstring>

#include "core/error.h"
#include "tokenizer/nfc.h"
#include "tokenizer/encode_context.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode_tables.h"
#include "tokenizer/utf8.h"

namespace qtrain {
namespace {

std::atomic<uint64_t> g_next_serial{1};

}  // namespace

namespace {

EncodeContext& context_for(uint64_t serial) {
    thread_local EncodeContext ctx;
    if (ctx.owner != serial) {
        ctx.cache.clear();
        ctx.owner = serial;
    }
    return ctx;
}

}  // namespace

Tokenizer::Tokenizer(TokenizerSpec spec)
    : source_(std::move(spec.source)),
      format_(spec.format),
      added_(std::move(spec.added)),
      raw_matcher_(added_, /*normalized=*/false),
      normalized_matcher_(added_, /*normalized=*/true),
      nfc_(spec.nfc),
      ignore_merges_(spec.ignore_merges),
      split_(spec.split),
      bos_id_(spec.bos_id),
      serial_(g_next_serial.fetch_add(1)) {
    const int32_t num_regular = static_cast<int32_t>(spec.tokens.size());
    auto bpe = std::make_shared<BpeModel>(std::move(spec.tokens));
    for (const TokenizerSpec::Merge& m : spec.merges) {
        QT_CHECK(m.left >= 0 && m.left < num_regular && m.right >= 0 && m.right < num_regular &&
                     m.result >= 0 && m.result < num_regular,
                 source_, ": merge refers to a token id outside the vocabulary");
        bpe->add_merge(m.left, m.right, m.rank, m.result);
    }
    bpe_ = std::move(bpe);

    int32_t size = num_regular;
    for (const AddedToken& t : added_) {
        QT_CHECK(t.id >= 0, source_, ": added token '", t.content, "' has a negative id");
        size = std::max(size, t.id + 1);
    }
    by_id_.assign(size, nullptr);
    special_.assign(size, 0);
    for (int32_t id = 0; id < num_regular; ++id) {
        by_id_[id] = &bpe_->token(id);
        ids_by_bytes_.emplace(bpe_->token(id), id);
    }
    for (const AddedToken& t : added_) {
        by_id_[t.id] = &t.content;
        special_[t.id] = t.special ? 1 : 0;
        ids_by_bytes_[t.content] = t.id;
        if (t.content.find('\n') != std::string::npos) parallel_split_ok_ = false;
    }
    QT_CHECK(split_, source_, ": no split pattern");
    QT_CHECK(!bos_id_ || (*bos_id_ >= 0 && *bos_id_ < size && by_id_[*bos_id_]), source_,
             ": the post-processor's token id ", bos_id_.value_or(-1), " is not in the vocabulary");
}

EncodeContext& Tokenizer::context() const { return context_for(serial_); }

void Tokenizer::encode_pieces(std::string_view text, std::vector<int32_t>& out) const {
    EncodeContext& ctx = context_for(serial_);
    ctx.pieces.clear();
    pretokenize(text, *split_, ctx.pieces);
    for (const std::string_view piece : ctx.pieces) encode_piece(piece, ctx, out);
}

void Tokenizer::encode_piece(std::string_view piece, EncodeContext& ctx, std::vector<int32_t>& out) const {
    if (ctx.cache.lookup(piece, out)) return;
    const std::size_t before = out.size();
    const auto whole = ignore_merges_ ? ids_by_bytes_.find(std::string(piece)) : ids_by_bytes_.end();
    if (whole != ids_by_bytes_.end() && whole->second < bpe_->size()) {
        out.push_back(whole->second);
    } else {
        bpe_->encode(piece, out);
    }
    ctx.cache.insert(piece, out.data() + before, out.size() - before);
}

void Tokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out,
                               SpecialTokens mode) const {
    if (text.empty()) return;
    std::string storage;  // the NFC result, when it differs
    const std::string_view normalized = nfc_ ? nfc(text, storage) : text;
    split_added(
        normalized_matcher_, normalized, mode,
        [&](std::string_view part) { encode_pieces(part, out); },
        [&](int32_t id, std::string_view) { out.push_back(id); });
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out, SpecialTokens mode,
                       EncodeStats* stats) const {
    std::string repaired;
    if (utf8::valid_prefix(text) != text.size()) {
        const std::size_t n = utf8::append_repaired(text, repaired);
        if (stats) stats->invalid_utf8 += n;
        text = repaired;
    }
    split_added(
        raw_matcher_, text, mode,
        [&](std::string_view segment) { encode_segment(segment, out, mode); },
        [&](int32_t id, std::string_view) { out.push_back(id); });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, SpecialTokens mode) const {
    std::vector<int32_t> out;
    encode(text, out, mode);
    return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
    std::string out;
    for (const int32_t id : ids) {
        QT_CHECK(id >= 0 && id < vocab_size() && by_id_[id], "decode: token id ", id,
                 " is not in the vocabulary of ", source_, " (", vocab_size(), " ids)");
        if (skip_special && special_[id]) continue;
        out += *by_id_[id];
    }
    return out;
}

std::string Tokenizer::decode_text(std::span<const int32_t> ids, bool skip_special) const {
    const std::string bytes = decode(ids, skip_special);
    if (utf8::valid_prefix(bytes) == bytes.size()) return bytes;
    std::string text;
    utf8::append_repaired(bytes, text);
    return text;
}

std::vector<std::string_view> Tokenizer::split_for_parallel(std::string_view text,
                                                            std::size_t chunk_bytes) const {
    std::vector<std::string_view> chunks;
    std::size_t start = 0;
    if (parallel_split_ok_ && chunk_bytes > 0) {
        std::size_t search = chunk_bytes;
        while (search < text.size()) {
            const void* hit = std::memchr(text.data() + search, '\n', text.size() - search);
            if (!hit) break;
            const std::size_t p = static_cast<std::size_t>(static_cast<const char*>(hit) - text.data()) + 1;
            search = p;
            if (p >= text.size()) break;
            // The character after the LF must be a valid letter that NFC leaves alone: no piece
            // of the regex runs from a LF into a letter, and NFC restarts there.
            const std::string_view rest = text.substr(p, 4);
            const auto lead = static_cast<unsigned char>(rest[0]);
            const int need = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
            if (utf8::valid_prefix(rest) < static_cast<std::size_t>(need)) continue;
            int len;
            const char32_t cp = utf8::decode(rest.data(), len);
            const uint8_t props = unicode::properties(cp);
            if (!(props & unicode::kLetter) || !(props & unicode::kNfcBoundary)) continue;
            chunks.push_back(text.substr(start, p - start));
            start = p;
            search = p + chunk_bytes;
        }
    }
    chunks.push_back(text.substr(start));
    return chunks;
}

std::optional<std::string> Tokenizer::end_of_text() const {
    for (const char* token : {"<|endoftext|>", "<|end_of_text|>"}) {
        if (token_id(token)) return token;
    }
    return std::nullopt;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
    const auto it = ids_by_bytes_.find(std::string(token));
    if (it == ids_by_bytes_.end()) return std::nullopt;
    return it->second;
}

}  // namespace qtrain
