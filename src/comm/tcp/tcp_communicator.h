// The TCP backend: one rank per process on any hosts that reach rank 0's MASTER_ADDR:MASTER_PORT
// (torchrun/Slurm launches, comm/launch_env.h), host buffers, each collective complete before it returns
// (stream must be null). No MPI needed; its first use is the host communicator of a multi-node run and
// the channel for the NCCL unique id (broadcast_bytes).
//
// Rendezvous: rank 0 binds MASTER_ADDR:MASTER_PORT (SO_REUSEADDR) and accepts; every other rank connects,
// retrying while nobody listens there yet, and sends a hello (magic, protocol version, world size, rank,
// run token). Rank 0 answers each; a peer that is not qtrain (wrong magic) is dropped; one of another run
// (different token) or a rank already taken is refused and rank 0 keeps waiting; a different world size is
// an error on both sides naming the address, port and both sizes. Once all have arrived, rank 0 closes
// the listener and tells every peer to start. Nothing waits silently or forever: each rank says at once
// what it waits for and then every `progress_interval` how far it got (`progress`), and gives up after
// `connect_timeout`: rank 0 naming the ranks that never arrived (and telling the connected ones), a
// peer naming the address it could not reach and why. A MASTER_ADDR that does not resolve is an error
// at once (only a resolver that does not answer is retried).
//
// Collectives: a star through rank 0. Each peer sends a header (collective, dtype, count, root, sequence
// number) and its data; rank 0 checks the header against its own call (ranks calling different
// collectives fail by name), sums the raw blocks with sum_in_rank_order (rank order, fp32, one
// rounding: the other backends' bits) or assembles them, and sends each peer its result. Simple and
// correct; rank 0's link carries all the traffic, fine for a host communicator's small messages.
//
// Failure: every wait polls with `io_timeout`. A peer whose process dies closes its socket, so rank 0
// fails at once with an error naming it and relays that error to the other peers (which fail naming
// it too); rank 0 dying makes every peer fail naming rank 0. After a failure every call throws.
// abort() sends the reason the same way. Hosts must share byte order (all x86-64 and aarch64 do).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/launch_env.h"

namespace qtrain::comm {

struct TcpOptions {
    // How long the rendezvous may wait, from its start: rank 0 for every rank to connect, a peer for
    // rank 0 to be up and then (from its connection) for rank 0's word that all have arrived. Zero or
    // less: no bound. torchrun's rendezvous waits 600 s by default too.
    std::chrono::milliseconds connect_timeout = std::chrono::minutes(10);
    // The longest wait for a live peer inside a collective: an hour, like the threads backend's
    // trainer timeout, as rank 0 alone may hash checkpoints while the others wait. A killed peer is
    // seen at once (its connection closes), not after this.
    std::chrono::milliseconds io_timeout = std::chrono::hours(1);
    // What set connect_timeout, named in the errors ("--rendezvous-timeout=600"); may be empty.
    std::string timeout_setting;
    // Lines saying what the rendezvous waits for: one at once, then one about every
    // `progress_interval` while it waits (rank 0: the ranks that have joined and those it still waits
    // for; the others: whether rank 0 answers). Null: silent.
    std::function<void(const std::string&)> progress;
    std::chrono::milliseconds progress_interval = std::chrono::seconds(10);
};

// Rendezvous as launch.rank of launch.world at launch.master_addr:master_port; returns once every rank
// has connected. Throws qtrain::Error as described above.
std::unique_ptr<Communicator> make_tcp_communicator(const LaunchEnv& launch, const TcpOptions& options = {});

}  // namespace qtrain::comm
