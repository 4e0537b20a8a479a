// The Qwen2 pre-tokenizer: splits text into the pieces that BPE encodes one by one. It is the
// regex of Qwen2's tokenizer.json (also Qwen3's and qwen.tiktoken's)
//
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
//
// hand-written as a state machine (no regex engine: faster, no dependency). Every character starts
// some alternative, so the matches tile the text and each piece is the first alternative that
// matches at the end of the previous one; pretokenizer.cpp derives each case from the regex.
#pragma once

#include <string_view>
#include <vector>

namespace qtrain {

extern const char* const kQwen2SplitPattern;  // the regex above, as tokenizer.json spells it

// Appends the pieces of valid UTF-8 `text` to `pieces` (views into `text`, in order, covering it).
void qwen2_pretokenize(std::string_view text, std::vector<std::string_view>& pieces);

}  // namespace qtrain
