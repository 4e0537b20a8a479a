// The pre-tokenizer: splits text into the pieces that BPE encodes one by one. It is the split regex
// of Qwen2's tokenizer.json (also Qwen3's and qwen.tiktoken's)
//
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
//
// or Llama 3's (also Llama 3.1's, 3.2's and Meta's tiktoken tokenizer's), which differs only in the
// third alternative, \p{N}{1,3}: runs of up to three number characters instead of one. Hand-written
// as a state machine (no regex engine: faster, no dependency). Every character starts some
// alternative, so the matches tile the text and each piece is the first alternative that matches at
// the end of the previous one; pretokenizer.cpp derives each case from the regex.
#pragma once

#include <string_view>
#include <vector>

namespace qtrain {

// A split regex qtrain implements: the text tokenizer.json spells, and the one thing in which the
// implemented regexes differ, the most number characters one piece holds.
struct SplitPattern {
    const char* name;  // for messages
    const char* regex;
    int max_digits;
};
extern const SplitPattern kQwen2Split;   // \p{N}: one number character a piece
extern const SplitPattern kLlama3Split;  // \p{N}{1,3}
// The implemented pattern whose regex is exactly `regex`, or nullptr.
const SplitPattern* find_split_pattern(std::string_view regex);

// Appends the pieces of valid UTF-8 `text` to `pieces` (views into `text`, in order, covering it).
void pretokenize(std::string_view text, const SplitPattern& pattern, std::vector<std::string_view>& pieces);

}  // namespace qtrain
