#include "tokenizer/chat_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/chat_template_source.h"  // generated from python/qtrain/chat_template.py

namespace qtrain {

const char* chat_renderer_source() { return kChatTemplateSource; }

namespace {

void write_all(int fd, const std::string& data) {
    std::size_t done = 0;
    while (done < data.size()) {
        const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
        if (n < 0 && errno == EINTR) continue;
        QT_CHECK(n > 0, "the chat renderer stopped reading its input (", std::strerror(errno), ")");
        done += static_cast<std::size_t>(n);
    }
}

std::string install_hint(const std::string& python) {
    return cat("the chat renderer needs Python 3 with jinja2 (the template engine transformers uses): install "
               "python3 (e.g. apt-get install python3) and jinja2 (pip install jinja2, or apt-get install "
               "python3-jinja2), or point --python=PATH (or QTRAIN_PYTHON) at a python that has it; tried '",
               python, "'");
}

}  // namespace

ChatProcess::ChatProcess(const ChatProcessOptions& options) : options_(options) {
    ::signal(SIGPIPE, SIG_IGN);  // a renderer that dies must give an error here, not kill tokenize
    int down[2], up[2];
    QT_CHECK(::pipe2(down, O_CLOEXEC) == 0 && ::pipe2(up, O_CLOEXEC) == 0, "chat renderer: pipe: ",
             std::strerror(errno));
    // Everything the child needs is made before fork: other threads may hold the allocator's lock, so
    // the child only calls dup2, exec and write (the parent says what to install when exec fails).
    const char* argv[] = {options.python.c_str(), "-c", kChatTemplateSource, "--serve", nullptr};
    const std::string exec_failed = cat("tokenize: cannot run '", options.python, "'\n");
    pid_ = ::fork();
    QT_CHECK(pid_ >= 0, "chat renderer: fork: ", std::strerror(errno));
    if (pid_ == 0) {
        ::dup2(down[0], STDIN_FILENO);
        ::dup2(up[1], STDOUT_FILENO);
        ::execvp(argv[0], const_cast<char* const*>(argv));
        (void)!::write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
        ::_exit(127);
    }
    ::close(down[0]);
    ::close(up[1]);
    to_child_ = down[1];
    from_child_ = ::fdopen(up[0], "r");
    QT_CHECK(from_child_, "chat renderer: fdopen: ", std::strerror(errno));

    nlohmann::json config = {{"template", options.template_text},
                             {"special_tokens", nlohmann::json::parse(options.special_tokens_json)},
                             {"end_of_turn", options.end_of_turn},
                             {"train_on", options.train_on},
                             {"template_kwargs", nlohmann::json::parse(options.template_kwargs_json)}};
    std::string hello;
    try {
        write_all(to_child_, config.dump(-1, ' ', true) + "\n");
        hello = read_line();
    } catch (const std::exception&) {
        throw Error(install_hint(options.python));
    }
    const auto reply = nlohmann::json::parse(hello, nullptr, false);
    QT_CHECK(!reply.is_discarded(), "the chat renderer (", options.python, ") answered '", hello.substr(0, 200),
             "' instead of its greeting; ", install_hint(options.python));
    if (reply.contains("error")) {
        const std::string error = reply["error"].get<std::string>();
        if (error.find("jinja2") != std::string::npos && error.find("pip install") != std::string::npos) {
            throw Error(cat("'", options.python, "' has no jinja2, the template engine transformers uses: install it "
                            "(pip install jinja2, or apt-get install python3-jinja2), or point --python=PATH (or "
                            "QTRAIN_PYTHON) at a python that has it"));
        }
        throw Error(error);
    }
    generation_blocks_ = reply.value("generation_blocks", false);
}

ChatProcess::~ChatProcess() {
    if (to_child_ >= 0) ::close(to_child_);  // EOF: the renderer's loop ends
    if (from_child_) std::fclose(from_child_);
    if (pid_ > 0) {
        int status;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
    }
}

std::string ChatProcess::read_line() {
    char* buffer = nullptr;
    std::size_t capacity = 0;
    const ssize_t n = ::getline(&buffer, &capacity, from_child_);
    std::string line = n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string();
    std::free(buffer);
    if (!line.empty() && line.back() == '\n') {
        line.pop_back();
        return line;
    }
    throw Error(cat("the chat renderer (", options_.python, ") exited unexpectedly; its messages are above"));
}

std::vector<RenderedChat> ChatProcess::render(const std::vector<std::string>& records) {
    std::exception_ptr write_error;
    std::thread writer([&] {
        try {
            std::string buffer;
            for (const std::string& r : records) {
                buffer += r;
                buffer += '\n';
                if (buffer.size() > (1u << 16)) {
                    write_all(to_child_, buffer);
                    buffer.clear();
                }
            }
            write_all(to_child_, buffer);
        } catch (...) {
            write_error = std::current_exception();
        }
    });
    std::vector<RenderedChat> out(records.size());
    std::exception_ptr read_error;
    try {
        for (RenderedChat& r : out) {
            const auto j = nlohmann::json::parse(read_line());
            if (j.contains("error")) {
                r.error = j["error"].get<std::string>();
                continue;
            }
            r.format = j.value("format", "");
            if (j.contains("skip")) {
                r.skip = j["skip"].get<std::string>();
                continue;
            }
            r.text = j["text"].get<std::string>();
            for (const auto& s : j["spans"]) r.spans.emplace_back(s[0].get<std::size_t>(), s[1].get<std::size_t>());
        }
    } catch (...) {
        read_error = std::current_exception();
    }
    if (read_error) {
        // the writer may be blocked on a full pipe: ending the renderer frees it with EPIPE
        if (pid_ > 0) ::kill(pid_, SIGTERM);
    }
    writer.join();
    if (read_error) std::rethrow_exception(read_error);
    if (write_error) std::rethrow_exception(write_error);
    return out;
}

std::vector<std::unique_ptr<ChatProcess>> start_chat_processes(const ChatProcessOptions& options, int n) {
    std::vector<std::unique_ptr<ChatProcess>> out(static_cast<std::size_t>(std::max(1, n)));
    out[0] = std::make_unique<ChatProcess>(options);  // first alone: a missing python or jinja2 fails once
    std::vector<std::exception_ptr> errors(out.size());
    std::vector<std::thread> starters;
    for (std::size_t i = 1; i < out.size(); ++i) {
        starters.emplace_back([&, i] {
            try {
                out[i] = std::make_unique<ChatProcess>(options);
            } catch (...) {
                errors[i] = std::current_exception();
            }
        });
    }
    for (auto& t : starters) t.join();
    for (auto& e : errors) {
        if (e) std::rethrow_exception(e);
    }
    return out;
}

}  // namespace qtrain
