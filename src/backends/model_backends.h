// The model backends behind IModel (the CPU reference model, the GPU model) and their communicators:
// the one place that knows which backends this build has. It sits below the engine (src/train/): the
// engine includes only this header, which names no device, so the engine and the Python package's
// bindings compile without CUDA headers; this library links the backends (docs/design.md, "Layers").
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "comm/wait_bound.h"
#include "model/imodel.h"
#include "model/memory_plan.h"
#include "model/model_config.h"
#include "model/model_options.h"

namespace qtrain {

// Whether this build has the CUDA backend (it can plan for a GPU even where none is present).
bool cuda_backend_built();
// "cpu" or "cuda" from --device (auto = cuda when this build has it and a GPU is present).
// need_gpu=false lets --device=cuda through without a GPU (for --plan-only).
std::string resolve_device(const std::string& device_flag, bool need_gpu = true);

// The plan of what the backend would allocate; allocates nothing (works without a GPU).
MemoryPlan plan_model(const ModelConfig& cfg, const ModelOptions& opts, const std::string& device);
std::unique_ptr<IModel> create_model(const ModelConfig& cfg, const ModelOptions& opts, const std::string& device);

// The communicator a rank's model does its collectives on (IModel::set_communicator), when it is not
// the trainer's own host communicator: the GPU model's will be NCCL or the copy engines over device
// memory, while the trainer agrees over the host (threads or MPI). Called by the rank loop
// (rank_session.cpp) on every rank of a run with more than one rank, on that rank's own thread or
// process, right after the rank's model is created (so its device, `device_index`, is current) and
// before set_communicator. All ranks call it at the same point, so it may use `host`'s collectives
// (e.g. to share an NCCL unique id from rank 0). `host` outlives the returned communicator, which
// lives as long as the rank's model. Null (or an empty function): the model uses `host` itself.
using ModelCommunicatorFactory =
    std::function<std::unique_ptr<comm::Communicator>(comm::Communicator& host, int device_index)>;
// The factory for `device`'s model at `world` ranks (`devices`: rank r's CUDA device, threads mode;
// `mpi`: one process per rank). The CPU model: empty (it shares the host communicator). The GPU model:
// with --memcpy-all-gather the copy-engine communicator (threads mode only; several ranks may share a
// GPU); else NCCL (threads mode: one process's communicators, two ranks on one GPU refused here,
// before any rank starts; MPI mode: rank 0's unique ids broadcast over the host communicator), whose
// creation gives up after `init_bound` when the other ranks do not all come (comm/cuda/nccl_communicator.h).
ModelCommunicatorFactory model_communicator_factory(const std::string& device, const ModelOptions& options, int world,
                                                    const std::vector<int>& devices, bool mpi,
                                                    const comm::WaitBound& init_bound = {});
// Human description of the device (and, on the GPU, the attention kernels chosen for cfg and opts) and
// its peak matmul rate for `opts.matmul_dtype`.
std::string describe_device(const std::string& device, const ModelConfig& cfg, const ModelOptions& opts,
                            double* peak_flops);

}  // namespace qtrain
