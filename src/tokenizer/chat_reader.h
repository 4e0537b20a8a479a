// Chat JSON Lines -> tokenized conversations with loss masks, a batch at a time (`tokenize --chat`).
// Each line is a record with `messages` (role/content, roles system/user/assistant/tool; assistant
// `tool_calls`; an optional `tools` list for the template) or `prompt`/`completion`; one file holds
// one of the two formats. A batch is cut into one piece per renderer (ChatProcess); a thread per
// piece renders it and tokenizes the renders (tokenize_chat), cut at max_tokens. Errors name the file and line; records
// that are not trained on (no assistant turn, or its part cut away by max_tokens) are counted.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/chat_mask.h"
#include "tokenizer/chat_process.h"
#include "tokenizer/tokenizer.h"

namespace qtrain {

struct ChatStats {
    int64_t records = 0;                 // non-blank lines read
    int64_t conversations = 0;           // written
    int64_t skipped_no_assistant = 0;    // no assistant message
    int64_t skipped_cut = 0;             // no trained token: all cut away by max_tokens, or none emitted
    int64_t truncated = 0;               // written, but cut at max_tokens
    int64_t tokens = 0, trained = 0;     // of the conversations written
};

struct Conversation {
    ChatTokens tokens;
    uint64_t offset = 0;  // where its line starts in the whole input (bytes over all files)
};

class ChatReader {
public:
    ChatReader(std::vector<std::string> files, std::vector<ChatProcess*> renderers, const Tokenizer& tokenizer,
               int64_t max_tokens);
    ~ChatReader();

    // Appends the conversations of about `max_bytes` of input to `out`; false at the end.
    bool read_batch(std::vector<Conversation>& out, std::size_t max_bytes);

    uint64_t total_bytes() const { return total_bytes_; }
    uint64_t bytes_read() const { return done_bytes_ + file_pos_; }
    const ChatStats& stats() const { return stats_; }

private:
    bool open_next_file();

    std::vector<std::string> files_;
    std::vector<ChatProcess*> renderers_;
    const Tokenizer& tokenizer_;
    int64_t max_tokens_;
    uint64_t total_bytes_ = 0, done_bytes_ = 0, file_pos_ = 0;
    std::size_t next_file_ = 0;
    std::unique_ptr<std::ifstream> in_;
    uint64_t line_no_ = 0;
    std::string format_;      // of the current file's records so far
    uint64_t format_line_ = 0;  // the line that set it
    ChatStats stats_;
};

}  // namespace qtrain
