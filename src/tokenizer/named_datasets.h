// Datasets `tokenize --dataset NAME` knows: where the raw text is and how to cut it into documents.
// qtrain's machines may have no network, so fetching is best effort: a file already in the
// download directory is used as is, else curl (when installed) downloads it, else the error names
// the URL and the file to put in place by hand.
#pragma once

#include <string>
#include <vector>

namespace qtrain {

struct NamedDataset {
    std::string name;
    std::string description;
    struct File {
        std::string url;
        std::string local_name;  // under the download directory
        bool eval = false;       // goes to eval.bin (else train)
    };
    std::vector<File> files;
    std::string doc_separator;  // DocumentReaderOptions::separator
    double eval_fraction = 0;   // used when no file is marked eval
};

const std::vector<NamedDataset>& named_datasets();
// Throws listing the known names when `name` is unknown.
const NamedDataset& find_named_dataset(const std::string& name);

// Returns the local path of `file`, downloading it into `download_dir` if it is not there yet.
std::string fetch_dataset_file(const NamedDataset& dataset, const NamedDataset::File& file,
                               const std::string& download_dir);

}  // namespace qtrain
