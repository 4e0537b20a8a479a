// Whether this process is one rank of a torchrun- or Slurm-style launch, read from the environment
// before anything connects, so the launcher can pick the TCP communicator (src/comm/tcp/).
//
// Precedence (first match wins; the caller checks mpirun first):
//   1. mpirun (OMPI_COMM_WORLD_*, detect_mpi_launch): detect_launch_env returns nullopt when
//      OMPI_COMM_WORLD_RANK is set, since mpirun's own numbering is the authority for its processes
//      even inside a Slurm allocation.
//   2. torchrun: RANK and WORLD_SIZE (either one set means torchrun-style; then RANK, WORLD_SIZE,
//      LOCAL_RANK, MASTER_ADDR and MASTER_PORT must all be set; LOCAL_WORLD_SIZE is optional).
//      Wins over Slurm: torchrun started by srun sees SLURM_PROCID of its launcher, not its workers.
//   3. Slurm (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; MASTER_ADDR when set, else the first
//      host of SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST, SLURM_NODELIST: compressed lists such as
//      gpu[007-012,020] are read, first_slurm_host), where srun's default block distribution puts rank
//      0; MASTER_PORT when set, else 20000 + SLURM_JOB_ID % 20000 (29500 without a job id).
//   Otherwise nullopt (a single process).
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace qtrain::comm {

struct LaunchEnv {
    std::string source;      // "torchrun" or "slurm": for messages
    int rank = 0;            // RANK / SLURM_PROCID
    int world = 1;           // WORLD_SIZE / SLURM_NTASKS
    int local_rank = 0;      // LOCAL_RANK / SLURM_LOCALID: the rank among this node's processes (its GPU)
    int local_world = 0;     // LOCAL_WORLD_SIZE when set, else 0 (unknown; Slurm's per-node counts vary)
    std::string master_addr; // MASTER_ADDR: where rank 0 listens (a host name or an IP address)
    int master_port = 0;     // MASTER_PORT, 1..65535
    std::string addr_from = "MASTER_ADDR";  // where master_addr and master_port came from, for messages:
    std::string port_from = "MASTER_PORT";  // the variables, or what Slurm's were derived from
    std::string run_token;   // TORCHELASTIC_RUN_ID or SLURM_JOB_ID.SLURM_STEP_ID (or QTRAIN_RUN_TOKEN, which
                             // overrides both): tells two runs on one port apart; empty when none is set
};

// The first host a Slurm node list names: "gpu[007-012,020],cpu1" -> "gpu007"; "a[1-2]-b[3,5]" ->
// "a1-b3"; "node1,node2" -> "node1". A qtrain::Error for an empty or malformed list.
std::string first_slurm_host(const std::string& list);

// nullopt as above. A qtrain::Error naming the variable for a partial set, a value that is not a
// number, rank >= world, local rank > rank (or >= LOCAL_WORLD_SIZE), or a port outside 1..65535.
std::optional<LaunchEnv> detect_launch_env();
// The same over another environment (tests): `lookup(name)` returns the value or null.
std::optional<LaunchEnv> detect_launch_env(const std::function<const char*(const char*)>& lookup);

}  // namespace qtrain::comm
