// Where `tokenize --chat` gets the chat template and the special tokens the template sees: as
// transformers loads them, chat_template.jinja in the tokenizer's directory, else tokenizer_config.json's
// "chat_template" (a string, or a list of {name, template} of which "default" is taken); or a file given
// by --chat-template. bos_token, eos_token, ... come from tokenizer_config.json when it is there.
#pragma once

#include <string>

namespace qtrain {

struct ChatTemplateInfo {
    std::string text;                    // the Jinja source
    std::string source;                  // where it came from, for messages
    std::string special_tokens_json = "{}";  // {"bos_token": "...", "eos_token": "...", ...}
    std::string eos_token;               // "" when tokenizer_config.json names none
};

// `tokenizer_path`: the tokenizer file or directory given to tokenize; `template_file`: --chat-template
// (empty: look next to the tokenizer). Throws naming the files looked at when no template is found.
ChatTemplateInfo load_chat_template(const std::string& tokenizer_path, const std::string& template_file);

}  // namespace qtrain
