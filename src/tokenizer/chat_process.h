// The chat-template renderer of `tokenize`: python/qtrain/chat_template.py (embedded in the binary at
// build time, run as `PYTHON -c SOURCE --serve`), a child process that renders JSON Lines records with
// the model's Jinja template exactly as transformers' apply_chat_template does (jinja2 is the engine
// transformers uses; a C++ imitation of it would drift) and says which bytes of the render are trained
// on. Records go down one pipe, answers come back up another; a writer thread keeps both moving, so
// neither side waits on a full pipe.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace qtrain {

struct ChatProcessOptions {
    std::string python = "python3";
    std::string template_text;           // the Jinja chat template
    std::string special_tokens_json = "{}";  // {"bos_token": ..., "eos_token": ...} from tokenizer_config.json
    std::vector<std::string> end_of_turn;    // strings that end an assistant turn (rule b)
    std::string train_on = "assistant";      // assistant | last-assistant | all
    std::string template_kwargs_json = "{}";  // extra template variables, e.g. {"enable_thinking": false}
};

struct RenderedChat {
    std::string text;                                    // the render (empty when skipped or an error)
    std::vector<std::pair<std::size_t, std::size_t>> spans;  // trained bytes [begin, end) of text
    std::string format;                                  // "messages" or "prompt/completion"
    std::string skip;                                    // nonempty: not trained on, and why
    std::string error;                                   // nonempty: the record is bad, and why
};

class ChatProcess {
public:
    // Starts the renderer and waits for it to compile the template; throws with what to install when
    // python or jinja2 is missing, or with jinja2's message when the template does not compile.
    explicit ChatProcess(const ChatProcessOptions& options);
    ~ChatProcess();
    ChatProcess(const ChatProcess&) = delete;
    ChatProcess& operator=(const ChatProcess&) = delete;

    // Renders JSON Lines records (one JSON object per string, no line break), in order.
    std::vector<RenderedChat> render(const std::vector<std::string>& records);
    // Whether the template has {% generation %} blocks (rule a) rather than the prefix rule (b).
    bool generation_blocks() const { return generation_blocks_; }

private:
    std::string read_line();  // throws when the renderer has died

    ChatProcessOptions options_;
    pid_t pid_ = -1;
    int to_child_ = -1;
    std::FILE* from_child_ = nullptr;
    bool generation_blocks_ = false;
};

// `n` renderers for rendering on several cores: the first alone (so a missing python, jinja2 or a bad
// template fails once), then the others side by side (each takes a python start and a template
// compile); throws the first error.
std::vector<std::unique_ptr<ChatProcess>> start_chat_processes(const ChatProcessOptions& options, int n);

// The Python source run as the renderer (the generated header's copy of chat_template.py).
const char* chat_renderer_source();

}  // namespace qtrain
