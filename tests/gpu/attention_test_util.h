// What the GPU attention tests share (attention_test.cpp: plain causal, every backend;
// attention_doc_test.cpp: document masking): the fused qkv layout, random inputs, the CPU reference,
// NaN-filled output buffers with a guard zone behind them (a forgotten or stray write fails), and one
// GPU forward + backward that returns every output as fp32 and as raw bytes; the tolerances against
// the CPU reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "cuda/attention.h"
#include "gpu_test_util.h"
#include "model/cpu/cpu_ops.h"

namespace qtrain::test::attention {

inline std::size_t qkv_width(const AttentionShape& s) { return static_cast<std::size_t>(s.Hq + 2 * s.Hkv) * s.D; }
inline std::size_t tokens(const AttentionShape& s) { return static_cast<std::size_t>(s.B) * s.T; }

// Random fused qkv rows: q and k with std qk_std (> 1: a sharper softmax), v with std 1.
inline std::vector<float> random_qkv(const AttentionShape& s, float qk_std, uint64_t seed) {
    std::vector<float> qkv = random_vector(tokens(s) * qkv_width(s), seed);
    const std::size_t qk_cols = static_cast<std::size_t>(s.Hq + s.Hkv) * s.D;
    for (std::size_t n = 0; n < tokens(s); ++n)
        for (std::size_t i = 0; i < qk_cols; ++i) qkv[n * qkv_width(s) + i] *= qk_std;
    return qkv;
}

// The three [B, T, H, D] parts of a fused [B*T, (Hq + 2 Hkv) * D] tensor (qkv or dqkv).
struct Parts {
    std::vector<float> q, k, v;
};
inline Parts split_qkv(const std::vector<float>& x, const AttentionShape& s) {
    const std::size_t w = qkv_width(s), nq = static_cast<std::size_t>(s.Hq) * s.D,
                      nk = static_cast<std::size_t>(s.Hkv) * s.D;
    Parts p;
    p.q.resize(tokens(s) * nq);
    p.k.resize(tokens(s) * nk);
    p.v.resize(tokens(s) * nk);
    for (std::size_t n = 0; n < tokens(s); ++n) {
        const float* row = x.data() + n * w;
        std::memcpy(p.q.data() + n * nq, row, nq * sizeof(float));
        std::memcpy(p.k.data() + n * nk, row + nq, nk * sizeof(float));
        std::memcpy(p.v.data() + n * nk, row + nq + nk, nk * sizeof(float));
    }
    return p;
}

struct Result {
    std::vector<float> out, lse;
    Parts d;                                                // dq, dk, dv
    std::vector<uint8_t> out_bytes, lse_bytes, dqkv_bytes;  // raw, for bitwise comparisons
};

// Reference: fp32 CPU ops on exactly the values the GPU sees; pos = document positions (null: causal).
inline Result run_cpu(const std::vector<float>& qkv, const std::vector<float>& dout, const AttentionShape& s,
                      const int32_t* pos = nullptr) {
    const Parts x = split_qkv(qkv, s);
    Result r;
    r.out.assign(tokens(s) * s.Hq * s.D, 0.0f);
    r.lse.assign(static_cast<std::size_t>(s.B) * s.Hq * s.T, 0.0f);
    cpu::attention_forward(r.out.data(), r.lse.data(), x.q.data(), x.k.data(), x.v.data(), s.B, s.T, s.Hq, s.Hkv, s.D,
                           pos);
    r.d.q.assign(x.q.size(), 0.0f);  // the CPU backward accumulates
    r.d.k.assign(x.k.size(), 0.0f);
    r.d.v.assign(x.v.size(), 0.0f);
    cpu::attention_backward(r.d.q.data(), r.d.k.data(), r.d.v.data(), dout.data(), x.q.data(), x.k.data(),
                            x.v.data(), r.lse.data(), s.B, s.T, s.Hq, s.Hkv, s.D, pos);
    return r;
}

constexpr std::size_t kGuardBytes = 4096;

// A buffer of `bytes` followed by a guard zone, all 0xFF (NaN in fp32 and bf16).
inline DeviceBuffer nan_buffer(std::size_t bytes) {
    DeviceBuffer m(bytes + kGuardBytes);
    m.fill_bytes(0xFF);
    return m;
}
inline ::testing::AssertionResult GuardIntact(const char* what, const DeviceBuffer& m) {
    const auto all = to_host<uint8_t>(m.get(), m.bytes());
    for (std::size_t i = m.bytes() - kGuardBytes; i < m.bytes(); ++i)
        if (all[i] != 0xFF)
            return ::testing::AssertionFailure()
                   << what << ": write past the end, " << (i - (m.bytes() - kGuardBytes)) << " bytes after it";
    return ::testing::AssertionSuccess();
}

// Forward then backward on the GPU (the backward in `chunks` chunks of sequences), with document
// positions (null: plain causal); outputs read back as fp32 and as raw bytes. For bf16 also the
// FP8-training variant of the forward (fused abs-max of out), which must give the same bytes.
inline Result run_gpu(DType dtype, AttentionBackend be, const std::vector<float>& qkv, const std::vector<float>& dout,
                      const AttentionShape& s, const std::vector<int32_t>* pos = nullptr, int chunks = 1) {
    const std::size_t es = dtype_size(dtype);
    const std::size_t n_out = tokens(s) * s.Hq * s.D, n_lse = static_cast<std::size_t>(s.B) * s.Hq * s.T;
    DeviceBuffer d_qkv(qkv, dtype), d_dout(dout, dtype);
    DeviceBuffer d_pos;
    if (pos) d_pos = to_device(*pos);
    const int32_t* p = pos ? d_pos.as<int32_t>() : nullptr;
    DeviceBuffer d_out = nan_buffer(n_out * es), d_lse = nan_buffer(n_lse * 4), d_dqkv = nan_buffer(qkv.size() * es);
    DeviceBuffer d_ws = nan_buffer(attention_backward_workspace_bytes(dtype, s, chunks, be));

    attention_forward(dtype, d_out.get(), d_lse.as<float>(), d_qkv.get(), s, nullptr, nullptr, be, d_ws.get(), p);
    sync_device();
    attention_backward(dtype, d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.as<float>(), d_ws.get(), s,
                       nullptr, chunks, be, p);
    sync_device();
    EXPECT_TRUE(GuardIntact("out", d_out));
    EXPECT_TRUE(GuardIntact("lse", d_lse));
    EXPECT_TRUE(GuardIntact("dqkv", d_dqkv));
    EXPECT_TRUE(GuardIntact("workspace", d_ws));

    Result r;
    r.out = download_as(dtype, d_out.get(), n_out);
    r.lse = to_host<float>(d_lse.get(), n_lse);
    r.d = split_qkv(download_as(dtype, d_dqkv.get(), qkv.size()), s);
    r.out_bytes = to_host<uint8_t>(d_out.get(), n_out * es);
    r.lse_bytes = to_host<uint8_t>(d_lse.get(), n_lse * 4);
    r.dqkv_bytes = to_host<uint8_t>(d_dqkv.get(), qkv.size() * es);

    if (dtype == DType::BF16) {
        DeviceBuffer d_out2 = nan_buffer(n_out * es), d_lse2 = nan_buffer(n_lse * 4);
        DeviceBuffer d_amax(std::vector<float>{-1.0f, 0, 0, 0}, DType::F32);
        attention_forward(dtype, d_out2.get(), d_lse2.as<float>(), d_qkv.get(), s, nullptr, d_amax.f32(), be,
                          d_ws.get(), p);
        sync_device();
        EXPECT_EQ(to_host<uint8_t>(d_out2.get(), n_out * es), r.out_bytes) << "the amax variant changed out";
        float want = 0.0f;
        for (float x : r.out) want = std::max(want, std::fabs(x));
        EXPECT_EQ(d_amax.download()[0], want) << "fused abs-max of the attention output";
    }
    return r;
}

// Tolerances against the CPU reference, as max|gpu - cpu| <= rtol * max|cpu| + atol per tensor (plus a
// cosine floor for bf16); attention_test.cpp's comment gives the reasoning. fp32 differs from the CPU
// only in summation order and fast-math exp2/log2; bf16 by its roundings of P, dS and the outputs.
struct Tol {
    double rtol, atol, min_cosine;
};
struct Tolerances {
    Tol out, lse, grad;
};
inline Tolerances tolerances(DType dtype) {
    if (dtype == DType::F32) return {{1e-5, 1e-6, 0.0}, {1e-5, 1e-6, 0.0}, {2e-5, 1e-5, 0.0}};
    return {{2e-2, 1e-3, 0.9999}, {1e-3, 1e-4, 0.0}, {2e-2, 1e-3, 0.9999}};
}

}  // namespace qtrain::test::attention
