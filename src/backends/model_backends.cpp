#include "backends/model_backends.h"

#include "core/error.h"
#include "core/files.h"
#include "model/cpu/cpu_model.h"
#include "backends/peak_rates.h"

#ifdef QTRAIN_HAVE_CUDA
#include "comm/cuda/copy_engine_communicator.h"
#include "comm/thread_world.h"
#include "cuda/device.h"
#include "model/cuda/attention_choice.h"
#include "model/cuda/cuda_model.h"
#ifdef QTRAIN_HAVE_NCCL
#include "comm/cuda/nccl_communicator.h"
#endif
#endif

namespace qtrain {

static int gpu_count() {
#ifdef QTRAIN_HAVE_CUDA
    return cuda_device_count();
#else
    return 0;
#endif
}

bool cuda_backend_built() {
#ifdef QTRAIN_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

std::string resolve_device(const std::string& flag, bool need_gpu) {
    if (flag == "cpu") return "cpu";
    if (flag == "cuda") {
#ifndef QTRAIN_HAVE_CUDA
        throw_error("--device=cuda: this build has no CUDA backend (nvcc was not found when it was configured); "
                    "use --device=cpu or rebuild with the CUDA toolkit");
#endif
        QT_CHECK(!need_gpu || gpu_count() > 0,
                 "--device=cuda: no GPU is visible (cudaGetDeviceCount found none); use --device=cpu");
        return "cuda";
    }
    QT_CHECK(flag == "auto", "--device: expected auto, cpu or cuda, got '", flag, "'");
    return gpu_count() > 0 ? "cuda" : "cpu";
}

MemoryPlan plan_model(const ModelConfig& cfg, const ModelOptions& opts, const std::string& device) {
    if (device == "cpu") return CpuModel::plan(cfg, opts);
#ifdef QTRAIN_HAVE_CUDA
    return CudaModel::plan(cfg, opts);
#else
    throw_error("--device=cuda: this build has no CUDA backend");
#endif
}

std::unique_ptr<IModel> create_model(const ModelConfig& cfg, const ModelOptions& opts, const std::string& device) {
    if (device == "cpu") return std::make_unique<CpuModel>(cfg, opts);
#ifdef QTRAIN_HAVE_CUDA
    return std::make_unique<CudaModel>(cfg, opts);
#else
    throw_error("--device=cuda: this build has no CUDA backend");
#endif
}

ModelCommunicatorFactory model_communicator_factory(const std::string& device, const ModelOptions& options, int world,
                                                    const std::vector<int>& devices, bool mpi,
                                                    const comm::WaitBound& init_bound) {
    if (device != "cuda" || world <= 1) return {};
#ifdef QTRAIN_HAVE_CUDA
    if (options.memcpy_all_gather) {
        QT_CHECK(!mpi, "--memcpy-all-gather: the copy-engine communicator connects the ranks of one process (threads "
                 "mode, --gpus=N); with one process per rank (mpirun, torchrun, Slurm) leave it out to use NCCL");
        // its own rendezvous (the host communicator's world is the trainer's); a failed rank aborts it
        auto rendezvous = std::make_shared<comm::ThreadWorld>(world);
        return [rendezvous](comm::Communicator& host, int device_index) -> std::unique_ptr<comm::Communicator> {
            return comm::make_copy_engine_communicator(*rendezvous, host.rank(), device_index);
        };
    }
#ifdef QTRAIN_HAVE_NCCL
    if (mpi)
        return [init_bound](comm::Communicator& host, int device_index) -> std::unique_ptr<comm::Communicator> {
            // the communicator's id and its bounded creation's probe id, both from rank 0
            comm::NcclId ids[2];
            comm::NcclInitWait wait{init_bound, {}};
            if (host.rank() == 0) ids[0] = comm::nccl_unique_id(), ids[1] = comm::nccl_unique_id();
            host.broadcast(ids, sizeof ids, DType::U8, 0);
            wait.probe_id = ids[1];
            return comm::make_nccl_communicator(ids[0], host.rank(), host.world(), device_index, wait);
        };
    std::shared_ptr<comm::NcclThreadsWorld> nccl;
    try {
        nccl = std::make_shared<comm::NcclThreadsWorld>(devices, init_bound);
    } catch (const std::exception& e) {
        throw_error(cat("--gpus=", world, ": ", e.what(), " (--gpu-ids=0,0 and the like need --memcpy-all-gather)"));
    }
    return [nccl](comm::Communicator& host, int) -> std::unique_ptr<comm::Communicator> {
        return comm::make_nccl_communicator(*nccl, host.rank());
    };
#else
    (void)devices, (void)mpi, (void)init_bound;
    throw_error(cat("--gpus=", world, " on the GPU needs NCCL, which this build has not found (scripts/setup.sh), or "
                    "--memcpy-all-gather (the copy-engine communicator, threads mode)"));
#endif
#else
    (void)options, (void)devices, (void)mpi, (void)init_bound;
    return {};
#endif
}

std::string describe_device(const std::string& device, const ModelConfig& cfg, const ModelOptions& opts,
                            double* peak_flops) {
    if (device == "cpu") {
        std::string desc;
        PeakRates r = cpu_peak_rates(&desc);
        if (peak_flops) *peak_flops = r.fp32;
        return "cpu: " + desc;
    }
#ifdef QTRAIN_HAVE_CUDA
    GpuInfo g = cuda_device_info(0);
    PeakRates r = gpu_peak_rates(g.name, g.sm_count, g.clock_mhz, g.cc_major);
    if (peak_flops) *peak_flops = r.for_matmul(opts.matmul_dtype);
    return cat("cuda:0 ", g.name, ", ", g.sm_count, " SMs, compute ", g.cc_major, ".", g.cc_minor, ", ",
               human_bytes(g.free_memory), " free of ", human_bytes(g.total_memory), "\n  attention: ",
               describe_attention_backend(cfg, opts), "\n  GEMMs: cuBLASLt, ",
               opts.gemm_autotune ? "autotuned (--gemm-autotune)" : "heuristic's first choice",
               opts.matmul_dtype == DType::E4M3
                   ? cat("; FP8 fast accumulation: ", opts.fp8_fast_accum == Fp8FastAccum::Off       ? "off"
                                                      : opts.fp8_fast_accum == Fp8FastAccum::Forward ? "forward"
                                                                                                     : "all",
                         "; LM head: ", opts.fp8_lm_head ? "FP8 (--lm-head-dtype=e4m3)" : "bf16",
                         is_fp8(opts.gradient_dtype) && opts.fp8_transposes_jit
                             ? "; weight transposes: just in time (--fp8-weight-transposes=jit)"
                             : "")
                   : std::string());
#else
    if (peak_flops) *peak_flops = 0;
    return device;
#endif
}

}  // namespace qtrain
