// The cuDNN frontend plumbing of attention_cudnn.cpp (bf16 SDPA): the frontend namespace, one cuDNN
// handle per thread and device, the packed layouts of attention.h as cuDNN's [batch, head, seq, dim]
// tensors, and building a graph. Included only by that file, which CMake compiles with the frontend's
// headers (QTRAIN_HAVE_CUDNN_FRONTEND): the headers are large, so they stay out of every other
// translation unit.
#pragma once

#if !defined(QTRAIN_HAVE_CUDNN_FRONTEND)
#error "cudnn_graph_util.h needs the cuDNN frontend (QTRAIN_HAVE_CUDNN_FRONTEND)"
#endif

#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#include "core/error.h"
#include "cuda/attention.h"
#include "cuda/check.h"

namespace qtrain::detail::cudnn {

namespace fe = cudnn_frontend;

inline void check_fe(fe::error_t e, const char* what) {
    QT_CHECK(e.is_good(), "cuDNN attention: ", what, " failed: ", e.get_message());
}

// False on a machine without a GPU (--plan-only there), with CUDA's sticky error state cleared.
inline bool gpu_visible() {
    int count = 0;
    if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) return true;
    cudaGetLastError();
    return false;
}

inline int current_device() {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    return dev;
}

// One handle per (thread, device): a cuDNN handle is bound to the device current at creation and
// must not be used by two threads at once (threads mode runs one thread per GPU).
inline cudnnHandle_t handle_for_current_device() {
    struct Handles {
        std::map<int, cudnnHandle_t> by_device;
        ~Handles() {
            for (auto& [dev, h] : by_device) cudnnDestroy(h);
        }
    };
    thread_local Handles handles;
    const int dev = current_device();
    auto it = handles.by_device.find(dev);
    if (it != handles.by_device.end()) return it->second;
    cudnnHandle_t h = nullptr;
    const cudnnStatus_t st = cudnnCreate(&h);
    QT_CHECK(st == CUDNN_STATUS_SUCCESS, "cuDNN attention: cudnnCreate failed on device ", dev, ": ",
             cudnnGetErrorString(st));
    handles.by_device.emplace(dev, h);
    return h;
}

// Packed layouts of attention.h as cuDNN's [batch, head, seq, dim] tensors.
struct Layout {
    int64_t B, T, Hq, Hkv, D, C;  // C: elements per qkv row, (Hq + 2*Hkv) * D
    explicit Layout(const AttentionShape& s)
        : B(s.B), T(s.T), Hq(s.Hq), Hkv(s.Hkv), D(s.D), C(static_cast<int64_t>(s.Hq + 2 * s.Hkv) * s.D) {}
    std::vector<int64_t> qkv_stride() const { return {T * C, D, C, 1}; }     // q, k, v, dq, dk, dv
    std::vector<int64_t> out_stride() const { return {T * Hq * D, D, Hq * D, 1}; }  // out, dout
    std::vector<int64_t> stats_dim() const { return {B, Hq, T, 1}; }           // lse [B, Hq, T]
    std::vector<int64_t> stats_stride() const { return {Hq * T, T, 1, 1}; }
};

// A graph with inputs and outputs of type `io` (bf16 for attention_cudnn.cpp), fp32 inside.
inline std::unique_ptr<fe::graph::Graph> new_graph(fe::DataType_t io) {
    auto g = std::make_unique<fe::graph::Graph>();
    g->set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(
        fe::DataType_t::FLOAT);
    return g;
}

inline std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, int64_t uid,
                                                          std::vector<int64_t> dim, std::vector<int64_t> stride) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
}

inline void build(fe::graph::Graph& g, cudnnHandle_t h, const char* what) {
    check_fe(g.validate(), what);
    check_fe(g.build_operation_graph(h), what);
    check_fe(g.create_execution_plans({fe::HeurMode_t::A}), what);
    check_fe(g.check_support(h), what);
    check_fe(g.build_plans(h), what);
}

inline int64_t workspace_of(const fe::graph::Graph& g) {
    int64_t bytes = 0;
    check_fe(g.get_workspace_size(bytes), "querying the workspace size");
    return bytes;
}

// Binds `stream` to the handle and runs a built graph.
inline void execute(const fe::graph::Graph& g, cudnnHandle_t h, std::unordered_map<int64_t, void*>& pack,
                    void* workspace, cudaStream_t stream, const char* what) {
    QT_CHECK(workspace != nullptr || workspace_of(g) == 0, "cuDNN attention: ", what, " needs ", workspace_of(g),
             " bytes of workspace and got none");
    const cudnnStatus_t st = cudnnSetStream(h, stream);
    QT_CHECK(st == CUDNN_STATUS_SUCCESS, "cuDNN attention: cudnnSetStream failed: ", cudnnGetErrorString(st));
    check_fe(g.execute(h, pack, workspace), what);
}

}  // namespace qtrain::detail::cudnn
