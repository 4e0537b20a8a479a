#include "comm/launch_env.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace qtrain::comm {
namespace {

using Lookup = std::function<const char*(const char*)>;

const char* require(const Lookup& lookup, const char* source, const char* name, const char* because) {
    const char* v = lookup(name);
    QT_CHECK(v && *v, source, " launch: ", name, " is not set although ", because, " is");
    return v;
}

int parse_int(const char* source, const char* name, const char* value, int lo, int hi) {
    int v = -1;
    const char* end = value + std::strlen(value);
    const auto [ptr, ec] = std::from_chars(value, end, v);
    QT_CHECK(ec == std::errc() && ptr == end && v >= lo && v <= hi, source, " launch: ", name, "='", value,
             "' is not an integer in ", lo, "..", hi);
    return v;
}

void check_ranks(const LaunchEnv& l, const char* rank_name, const char* world_name, const char* local_name) {
    const char* s = l.source.c_str();
    QT_CHECK(l.rank < l.world, s, " launch: ", rank_name, "=", l.rank, " is not a rank of ", world_name, "=", l.world);
    QT_CHECK(l.local_rank <= l.rank, s, " launch: ", local_name, "=", l.local_rank, " exceeds ", rank_name, "=",
             l.rank);
    QT_CHECK(l.local_world == 0 || l.local_rank < l.local_world, s, " launch: ", local_name, "=", l.local_rank,
             " is not a rank of LOCAL_WORLD_SIZE=", l.local_world);
    QT_CHECK(l.local_world <= l.world, s, " launch: LOCAL_WORLD_SIZE=", l.local_world, " exceeds ", world_name, "=",
             l.world);
}

void read_master(const Lookup& lookup, LaunchEnv& l, const char* because) {
    const char* s = l.source.c_str();
    l.master_addr = require(lookup, s, "MASTER_ADDR", because);
    l.master_port = parse_int(s, "MASTER_PORT", require(lookup, s, "MASTER_PORT", because), 1, 65535);
}

constexpr int kMaxInt = 1 << 30;

}  // namespace

std::string first_slurm_host(const std::string& list) {
    // the first item (commas inside brackets separate ranges, not items), each [..] replaced by its
    // first number as written (zero padding kept: node[007-012] -> node007)
    std::string host;
    int depth = 0;
    bool in_first = false;  // inside a bracket, before its first ',' or '-'
    for (char c : list) {
        if (depth == 0 && c == ',') break;
        if (c == '[') {
            QT_CHECK(depth == 0, "SLURM nodelist '", list, "': nested '['");
            depth = 1, in_first = true;
        } else if (c == ']') {
            QT_CHECK(depth == 1, "SLURM nodelist '", list, "': ']' without '['");
            depth = 0;
        } else if (depth == 0) {
            host += c;
        } else if (in_first) {
            if (c == ',' || c == '-') in_first = false;
            else host += c;
        }
    }
    QT_CHECK(depth == 0 && !host.empty(), "SLURM nodelist '", list, "' names no host");
    return host;
}

std::optional<LaunchEnv> detect_launch_env(const Lookup& lookup) {
    if (lookup("OMPI_COMM_WORLD_RANK")) return std::nullopt;  // mpirun's (see the header)
    LaunchEnv l;
    if (lookup("RANK") || lookup("WORLD_SIZE")) {
        l.source = "torchrun";
        const char* s = "torchrun";
        const char* because = lookup("RANK") ? "RANK" : "WORLD_SIZE";
        l.rank = parse_int(s, "RANK", require(lookup, s, "RANK", because), 0, kMaxInt);
        l.world = parse_int(s, "WORLD_SIZE", require(lookup, s, "WORLD_SIZE", because), 1, kMaxInt);
        l.local_rank = parse_int(s, "LOCAL_RANK", require(lookup, s, "LOCAL_RANK", because), 0, kMaxInt);
        if (const char* lw = lookup("LOCAL_WORLD_SIZE")) l.local_world = parse_int(s, "LOCAL_WORLD_SIZE", lw, 1, kMaxInt);
        read_master(lookup, l, because);
        check_ranks(l, "RANK", "WORLD_SIZE", "LOCAL_RANK");
        if (const char* id = lookup("TORCHELASTIC_RUN_ID")) l.run_token = id;
    } else if (lookup("SLURM_PROCID")) {
        l.source = "slurm";
        const char* s = "slurm";
        const char* because = "SLURM_PROCID";
        l.rank = parse_int(s, "SLURM_PROCID", lookup("SLURM_PROCID"), 0, kMaxInt);
        l.world = parse_int(s, "SLURM_NTASKS", require(lookup, s, "SLURM_NTASKS", because), 1, kMaxInt);
        l.local_rank = parse_int(s, "SLURM_LOCALID", require(lookup, s, "SLURM_LOCALID", because), 0, kMaxInt);
        // Rank 0 runs on the first host of the step's node list (srun's block distribution, its default;
        // with another distribution the user sets MASTER_ADDR). The port: MASTER_PORT, else one derived
        // from the job id, so two jobs sharing a node do not meet on the same port.
        const char* nodes_name = "SLURM_STEP_NODELIST";
        const char* nodes = lookup(nodes_name);
        if (!nodes) nodes = lookup(nodes_name = "SLURM_JOB_NODELIST");
        if (!nodes) nodes = lookup(nodes_name = "SLURM_NODELIST");
        if (const char* addr = lookup("MASTER_ADDR"); addr && *addr) {
            l.master_addr = addr;
        } else if (nodes && *nodes) {
            l.master_addr = first_slurm_host(nodes);
            l.addr_from = cat("the first host of ", nodes_name);
        } else {
            require(lookup, s, "MASTER_ADDR", "SLURM_PROCID (and no SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or SLURM_NODELIST to take the first host of)");
        }
        if (const char* port = lookup("MASTER_PORT"); port && *port) {
            l.master_port = parse_int(s, "MASTER_PORT", port, 1, 65535);
        } else {
            const char* job = lookup("SLURM_JOB_ID");
            l.master_port = 20000 + (job ? parse_int(s, "SLURM_JOB_ID", job, 0, kMaxInt) % 20000 : 9500);
            l.port_from = job ? "20000 + SLURM_JOB_ID % 20000" : "the default port";
        }
        check_ranks(l, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID");
        if (const char* job = lookup("SLURM_JOB_ID")) {
            const char* step = lookup("SLURM_STEP_ID");
            l.run_token = std::string(job) + "." + (step ? step : "");
        }
    } else {
        return std::nullopt;
    }
    if (const char* token = lookup("QTRAIN_RUN_TOKEN")) l.run_token = token;
    return l;
}

std::optional<LaunchEnv> detect_launch_env() {
    return detect_launch_env([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace qtrain::comm
