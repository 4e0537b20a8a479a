// Byte-level BPE tokenizer (Qwen2/Qwen2.5/Qwen3's and Llama 3/3.1/3.2's) that gives exactly the ids
// of HF `tokenizers`.
//
// Encoding, in the order HF applies it:
//  1. invalid UTF-8 -> U+FFFD per maximal ill-formed subsequence (as Python's
//     bytes.decode("utf-8", errors="replace"); HF itself only takes valid strings),
//  2. added tokens found in the raw text (see SpecialTokens for which ones count),
//  3. NFC on the text between them (when tokenizer.json has the NFC normalizer),
//  4. the split regex, Qwen2's or Llama 3's (pretokenizer.h), then byte-level BPE of each piece
//     (bpe.h).
// encode() gives the ids of the text alone (HF's add_special_tokens=False). What the post-processor
// adds to a document is bos_id(): Llama 3's <|begin_of_text|>, none for Qwen; `tokenize` (the
// BatchEncoder) puts it before each document, as HF's tokenizer(doc) does.
// Loads a HF tokenizer.json or a tiktoken rank file (qwen.tiktoken). Immutable after loading and
// safe to share between threads; each thread keeps its own cache of piece -> ids.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"

namespace qtrain {

// The kind of file a tokenizer was loaded from: what exporting it (hf_tokenizer_export.h) starts from.
enum class TokenizerFormat {
    kNone,      // built in memory
    kHfJson,    // a HF tokenizer.json
    kTiktoken,  // a tiktoken rank file
};

// What a loader hands to the Tokenizer (tokenizer_load.cpp, hf_tokenizer_json.cpp, tiktoken_file.cpp).
struct TokenizerSpec {
    std::string source;               // file it came from, for messages
    TokenizerFormat format = TokenizerFormat::kNone;
    std::vector<std::string> tokens;  // regular tokens: tokens[id] = bytes
    struct Merge {
        int32_t left, right, rank, result;
    };
    std::vector<Merge> merges;
    std::vector<AddedToken> added;
    bool nfc = false;
    bool ignore_merges = false;  // a piece that is itself a token is not merged (Llama 3 style)
    const SplitPattern* split = &kQwen2Split;
    std::optional<int32_t> bos_id;  // the post-processor's token before each sequence
};

struct TokenOffset {
    uint32_t begin, end;  // bytes of the encoded text
};

struct EncodeContext;

struct EncodeStats {
    std::size_t invalid_utf8 = 0;  // ill-formed sequences replaced by U+FFFD
};

class Tokenizer {
public:
    // A tokenizer.json, a *.tiktoken file, or a directory holding tokenizer.json (or
    // qwen.tiktoken). Errors name the path and what is wrong with it.
    static Tokenizer load(const std::string& path);
    static Tokenizer from_hf_json(const std::string& path);
    static Tokenizer from_tiktoken(const std::string& path);
    explicit Tokenizer(TokenizerSpec spec);
    Tokenizer(Tokenizer&&) = default;  // by_id_ points into added_ and bpe_: moving keeps them
    Tokenizer& operator=(Tokenizer&&) = default;
    Tokenizer(const Tokenizer&) = delete;
    Tokenizer& operator=(const Tokenizer&) = delete;

    // Appends the ids of `text` (any bytes) to `out`.
    void encode(std::string_view text, std::vector<int32_t>& out,
                SpecialTokens mode = SpecialTokens::kAsText, EncodeStats* stats = nullptr) const;
    std::vector<int32_t> encode(std::string_view text,
                                SpecialTokens mode = SpecialTokens::kAsText) const;
    // As encode(), plus for each token the bytes [begin, end) of `text` it comes from (HF's offsets,
    // in bytes; token_offsets.cpp). A token of NFC-composed text covers the whole run of original
    // characters that composed into it. `text` must be valid UTF-8 (throws otherwise).
    void encode_with_offsets(std::string_view text, std::vector<int32_t>& ids, std::vector<TokenOffset>& offsets,
                             SpecialTokens mode = SpecialTokens::kRecognize) const;

    // The bytes of the tokens (added tokens as their text); throws on an unknown id. The result
    // may be invalid UTF-8 when `ids` cuts a character.
    std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
    // As decode(), but always valid UTF-8: a cut character becomes U+FFFD (as HF's decode does).
    std::string decode_text(std::span<const int32_t> ids, bool skip_special = false) const;

    // Cuts `text` into chunks of about `chunk_bytes` each at places where encoding restarts
    // exactly (after a LF, before a letter), so that encoding the chunks one by one (in parallel)
    // and concatenating gives the ids of the whole text. Returns one chunk when there is no such
    // place (or an added token contains a LF).
    std::vector<std::string_view> split_for_parallel(std::string_view text,
                                                     std::size_t chunk_bytes) const;

    // Regular (BPE) tokens: what HF's tokenizer.vocab_size reports (151,643 for Qwen2.5).
    int regular_vocab_size() const { return bpe_->size(); }
    // Every id is below this: regular plus added tokens (151,665 for Qwen2.5).
    int vocab_size() const { return static_cast<int>(by_id_.size()); }
    std::size_t num_merges() const { return bpe_->num_merges(); }
    const BpeModel& bpe() const { return *bpe_; }
    const std::vector<AddedToken>& added_tokens() const { return added_; }
    // Id of an added token's text, or of a regular token given as raw bytes.
    std::optional<int32_t> token_id(std::string_view token) const;
    const std::string& source() const { return source_; }
    TokenizerFormat format() const { return format_; }
    bool normalizes_nfc() const { return nfc_; }
    bool ignore_merges() const { return ignore_merges_; }
    const SplitPattern& split_pattern() const { return *split_; }
    // The token the post-processor puts before each sequence (tokenizer.json's TemplateProcessing
    // "single": [<|begin_of_text|>, $A] for Llama 3), or none (Qwen2's post-processor adds nothing).
    std::optional<int32_t> bos_id() const { return bos_id_; }
    // The token that ends a document in pretraining data, appended by `tokenize` unless --eos says
    // otherwise: Qwen's <|endoftext|>, else Llama 3's <|end_of_text|>, else none.
    std::optional<std::string> end_of_text() const;

private:
    void encode_segment(std::string_view text, std::vector<int32_t>& out, SpecialTokens mode) const;
    void encode_pieces(std::string_view text, std::vector<int32_t>& out) const;
    void encode_piece(std::string_view piece, EncodeContext& ctx, std::vector<int32_t>& out) const;
    EncodeContext& context() const;

    std::string source_;
    TokenizerFormat format_ = TokenizerFormat::kNone;
    std::shared_ptr<const BpeModel> bpe_;
    std::vector<AddedToken> added_;
    AddedTokenMatcher raw_matcher_, normalized_matcher_;
    bool nfc_ = false;
    bool ignore_merges_ = false;
    const SplitPattern* split_ = &kQwen2Split;
    std::optional<int32_t> bos_id_;
    bool parallel_split_ok_ = true;
    std::vector<const std::string*> by_id_;  // id -> bytes (nullptr: no such id)
    std::vector<uint8_t> special_;           // id -> 1 for special added tokens
    std::unordered_map<std::string, int32_t> ids_by_bytes_;
    uint64_t serial_ = 0;  // tells the per-thread caches which tokenizer filled them
};

}  // namespace qtrain
