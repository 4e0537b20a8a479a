// The CPU reference of the fused Qwen3 q/k RMSNorm + RoPE (cuda::qk_norm_rope_forward / _backward),
// written once for the kernel tests that check it (qk_norm_rope_test.cpp, and rope_positions_test.cpp
// with document positions): the q and k heads cut out of the fused qkv buffer [N, (Hq + 2 Hkv) * D],
// cpu::head_rmsnorm_* on each head, then cpu::rope_* at the token's position; and the norm weights
// such tests draw. The inputs (values, seeds, positions) stay with each test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu_test_util.h"
#include "model/cpu/cpu_head_norm.h"
#include "model/cpu/cpu_ops.h"

namespace qtrain::test {

struct QkvDims {
    int B, T, Hq, Hkv, D;
    int N() const { return B * T; }
    int stride() const { return (Hq + 2 * Hkv) * D; }  // one token's q|k|v
    int qw() const { return Hq * D; }                   // q's columns, then k's
    int kw() const { return Hkv * D; }
};

// 1 + N(0, 0.5^2): trained norm weights are not ones, and the kernel must apply q's to q and k's to k.
inline std::vector<float> norm_weight(int D, uint64_t seed) {
    auto w = random_vector(D, seed, 0.5f);
    for (auto& v : w) v += 1.0f;
    return w;
}

// cos | sin tables of T x D/2 each at RoPE base 1e6: rope_tables(T, D) and cos() / sin() into them.
struct RopeTables {
    std::vector<float> cs;
    int T, half;
    RopeTables(int T_, int D) : cs(2 * static_cast<std::size_t>(T_) * (D / 2)), T(T_), half(D / 2) {
        cpu::rope_tables(cs.data(), cs.data() + static_cast<std::size_t>(T) * half, T, D, 1e6);
    }
    const float* cos() const { return cs.data(); }
    const float* sin() const { return cs.data() + static_cast<std::size_t>(T) * half; }
};

// The forward: q_pre / k_pre [N, H * D] as cut from qkv, q / k normalised and rotated, and the
// per-head rstd rq [N, Hq], rk [N, Hkv]. `pos` null: position t of each row.
struct QkNormRopeForward {
    std::vector<float> q_pre, k_pre, q, k, rq, rk;
};
inline QkNormRopeForward qk_norm_rope_reference_forward(const QkvDims& s, const std::vector<float>& qkv,
                                                        const std::vector<float>& wq, const std::vector<float>& wk,
                                                        const RopeTables& rt, float eps, const int32_t* pos) {
    const int N = s.N(), D = s.D;
    QkNormRopeForward f;
    f.q_pre = cut(qkv, N, s.stride(), 0, s.qw());
    f.k_pre = cut(qkv, N, s.stride(), s.qw(), s.kw());
    f.q = f.q_pre;
    f.k = f.k_pre;
    f.rq.resize(static_cast<std::size_t>(N) * s.Hq);
    f.rk.resize(static_cast<std::size_t>(N) * s.Hkv);
    cpu::head_rmsnorm_forward(f.q.data(), f.rq.data(), f.q.data(), wq.data(), int64_t{N} * s.Hq, D, eps);
    cpu::rope_forward(f.q.data(), f.q.data(), rt.cos(), rt.sin(), s.B, s.T, s.Hq, D, pos);
    cpu::head_rmsnorm_forward(f.k.data(), f.rk.data(), f.k.data(), wk.data(), int64_t{N} * s.Hkv, D, eps);
    cpu::rope_forward(f.k.data(), f.k.data(), rt.cos(), rt.sin(), s.B, s.T, s.Hkv, D, pos);
    return f;
}

// The backward of d (the gradient of the whole qkv buffer; its v part is not read): the inverse
// rotation, then the norm backward at the stored pre-norm q|k. dq / dk [N, H * D]; dwq / dwk are
// dwq0 / dwk0 with the weight gradients accumulated onto them.
struct QkNormRopeBackward {
    std::vector<float> dq, dk, dwq, dwk;
};
inline QkNormRopeBackward qk_norm_rope_reference_backward(const QkvDims& s, const std::vector<float>& d,
                                                          const QkNormRopeForward& f, const std::vector<float>& wq,
                                                          const std::vector<float>& wk, const std::vector<float>& dwq0,
                                                          const std::vector<float>& dwk0, const RopeTables& rt,
                                                          const int32_t* pos) {
    const int N = s.N(), D = s.D;
    QkNormRopeBackward b{cut(d, N, s.stride(), 0, s.qw()), cut(d, N, s.stride(), s.qw(), s.kw()), dwq0, dwk0};
    cpu::rope_backward(b.dq.data(), b.dq.data(), rt.cos(), rt.sin(), s.B, s.T, s.Hq, D, pos);
    cpu::head_rmsnorm_backward(b.dq.data(), b.dwq.data(), b.dq.data(), f.q_pre.data(), wq.data(), f.rq.data(),
                               int64_t{N} * s.Hq, D);
    cpu::rope_backward(b.dk.data(), b.dk.data(), rt.cos(), rt.sin(), s.B, s.T, s.Hkv, D, pos);
    cpu::head_rmsnorm_backward(b.dk.data(), b.dwk.data(), b.dk.data(), f.k_pre.data(), wk.data(), f.rk.data(),
                               int64_t{N} * s.Hkv, D);
    return b;
}

}  // namespace qtrain::test
