#include "train/rank_devices.h"

#include <climits>
#include <cstdlib>

#include "core/error.h"

namespace qtrain {

std::vector<int> parse_gpu_ids(const std::string& value) {
    const std::string usage = "expected one CUDA device index per rank, comma-separated, like --gpu-ids=0,1,2,3";
    std::vector<int> ids;
    std::size_t begin = 0;
    for (;;) {
        const std::size_t end = value.find(',', begin);
        const std::string item = value.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
        // digits only: strtol alone would take " 1", "+1" or "1x" as 1
        bool digits = !item.empty() && item.size() <= 9;
        for (char c : item) digits = digits && c >= '0' && c <= '9';
        QT_CHECK(digits, "--gpu-ids=", value, ": '", item, "' is not a device index (", usage, ")");
        ids.push_back(static_cast<int>(std::strtol(item.c_str(), nullptr, 10)));
        if (end == std::string::npos) break;
        begin = end + 1;
    }
    return ids;
}

void check_gpu_ids_count(const std::vector<int>& ids, int world, const std::string& ranks_source) {
    if (ids.empty()) return;
    QT_CHECK(static_cast<int>(ids.size()) == world, "--gpu-ids lists ", ids.size(), " device", ids.size() == 1 ? "" : "s",
             " but the run has ", world, " rank", world == 1 ? "" : "s", " (", ranks_source,
             "): give one device index per rank");
}

int rank_device_index(const std::vector<int>& ids, int rank, std::optional<int> mpi_local_rank) {
    if (!ids.empty()) return ids.at(static_cast<std::size_t>(rank));
    return mpi_local_rank ? *mpi_local_rank : rank;
}

}  // namespace qtrain
