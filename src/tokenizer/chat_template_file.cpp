#include "tokenizer/chat_template_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fs = std::filesystem;

namespace qtrain {
namespace {

std::string read_text(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    QT_CHECK(in.good(), "cannot read ", p.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// A special token as tokenizer_config.json spells it: a string or {"content": ...}.
std::string token_text(const nlohmann::json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return {};
}

}  // namespace

ChatTemplateInfo load_chat_template(const std::string& tokenizer_path, const std::string& template_file) {
    ChatTemplateInfo info;
    const fs::path dir = fs::is_directory(tokenizer_path) ? fs::path(tokenizer_path) : fs::path(tokenizer_path).parent_path();
    const fs::path config_path = dir / "tokenizer_config.json";
    nlohmann::json config = nlohmann::json::object();
    if (fs::exists(config_path)) {
        config = nlohmann::json::parse(read_text(config_path), nullptr, false);
        QT_CHECK(!config.is_discarded() && config.is_object(), config_path.string(), ": not a JSON object");
        nlohmann::json special = nlohmann::json::object();
        // transformers' special_tokens_map: the named special tokens that are set
        for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
            if (!config.contains(key)) continue;
            const std::string text = token_text(config[key]);
            if (!text.empty()) special[key] = text;
        }
        info.special_tokens_json = special.dump();
        if (special.contains("eos_token")) info.eos_token = special["eos_token"].get<std::string>();
    }
    if (!template_file.empty()) {
        QT_CHECK(fs::exists(template_file), "--chat-template: ", template_file, " does not exist");
        info.text = read_text(template_file);
        info.source = template_file;
        return info;
    }
    if (fs::exists(dir / "chat_template.jinja")) {
        info.text = read_text(dir / "chat_template.jinja");
        info.source = (dir / "chat_template.jinja").string();
        return info;
    }
    const auto t = config.find("chat_template");
    if (t != config.end() && t->is_string()) {
        info.text = t->get<std::string>();
        info.source = config_path.string() + " (chat_template)";
        return info;
    }
    if (t != config.end() && t->is_array()) {
        for (const auto& named : *t) {
            if (named.value("name", "") == "default" && named.contains("template") && named["template"].is_string()) {
                info.text = named["template"].get<std::string>();
                info.source = config_path.string() + " (chat_template \"default\")";
                return info;
            }
        }
    }
    throw Error(cat("no chat template: neither ", (dir / "chat_template.jinja").string(), " nor a chat_template in ",
                    config_path.string(), fs::exists(config_path) ? "" : " (which does not exist)",
                    "; give --chat-template=FILE (a Jinja chat template)"));
}

}  // namespace qtrain
