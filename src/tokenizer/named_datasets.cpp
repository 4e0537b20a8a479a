#include "tokenizer/named_datasets.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"

namespace qtrain {
namespace {

namespace fs = std::filesystem;

bool has_curl() { return std::system("command -v curl >/dev/null 2>&1") == 0; }

// Single-quotes `s` for /bin/sh.
std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) {
        if (c == '\'') {
            out += "'\\''";
        } else {
            out += c;
        }
    }
    return out + "'";
}

}  // namespace

const std::vector<NamedDataset>& named_datasets() {
    static const std::vector<NamedDataset> datasets = {
        {"tiny-shakespeare",
         "Shakespeare, 1 MB (Karpathy's char-rnn input.txt); one document per speech "
         "(blank-line separated), the speeches in the first 10% of the text as eval",
         {{"https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
           "tiny-shakespeare.txt", false}},
         "blank-line",
         0.1},
        {"tiny-stories",
         "TinyStories V2 (GPT-4 stories), 2.2 GB train + 22 MB validation; documents separated by "
         "<|endoftext|>",
         {{"https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-train.txt",
           "TinyStoriesV2-GPT4-train.txt", false},
          {"https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-valid.txt",
           "TinyStoriesV2-GPT4-valid.txt", true}},
         "<|endoftext|>",
         0},
    };
    return datasets;
}

const NamedDataset& find_named_dataset(const std::string& name) {
    std::string known;
    for (const NamedDataset& d : named_datasets()) {
        if (d.name == name) return d;
        known += (known.empty() ? "" : ", ") + d.name;
    }
    throw_error(cat("unknown dataset '", name, "' (known: ", known,
                    "); for other data pass --input=FILES"));
}

std::string fetch_dataset_file(const NamedDataset& dataset, const NamedDataset::File& file,
                               const std::string& download_dir) {
    const fs::path target = fs::path(download_dir) / file.local_name;
    std::error_code ec;
    if (fs::is_regular_file(target, ec) && fs::file_size(target, ec) > 0) return target.string();
    const std::string manual = cat("download ", file.url, " yourself and save it as ", target.string(),
                                   ", then run the same command again");
    QT_CHECK(has_curl(), "dataset ", dataset.name, ": curl is not installed, so ", file.url,
             " cannot be fetched; ", manual);
    fs::create_directories(download_dir, ec);
    const std::string tmp = target.string() + ".part";
    // curl's progress bar only on a terminal; its errors always.
    const std::string command = cat("curl -fSL ", isatty(STDERR_FILENO) ? "--progress-bar" : "-s",
                                    " --retry 2 --connect-timeout 20 -o ", shell_quote(tmp), " ",
                                    shell_quote(file.url));
    const int status = std::system(command.c_str());
    if (status != 0 || !fs::is_regular_file(tmp, ec) || fs::file_size(tmp, ec) == 0) {
        fs::remove(tmp, ec);
        throw_error(cat("dataset ", dataset.name, ": downloading ", file.url,
                        " failed (curl exit status ", WIFEXITED(status) ? WEXITSTATUS(status) : status,
                        "; is the network reachable?); ", manual));
    }
    fs::rename(tmp, target);
    return target.string();
}

}  // namespace qtrain
