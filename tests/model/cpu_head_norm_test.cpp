// The per-head RMSNorm reference (Qwen3 q_norm / k_norm, model/cpu/cpu_head_norm.h): forward against
// a double-precision evaluation, backward against central finite differences of L = sum(out * r)
// through the fp32 forward (random inputs, weights far from 1), alone and followed by RoPE (the chain
// the fused GPU kernels compute), plus its contracts: in place, dweight accumulated, deterministic.
#include "model/cpu/cpu_head_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "cpu_test_util.h"
#include "model/cpu/cpu_ops.h"

namespace qtrain {
namespace {

using test::central_difference;
using test::Near;
using test::random_vector;

using test::expect_gradient;
using test::weighted_sum;

// Weights 1 + N(0, 0.5^2), as trained norm weights drift: far from a no-op multiply.
std::vector<float> norm_weight(int D, uint64_t seed) {
    auto w = random_vector(D, seed, 0.5f);
    for (auto& v : w) v += 1.0f;
    return w;
}

TEST(CpuHeadNorm, ForwardNormalisesEveryHeadWithTheSharedWeight) {
    for (const int D : {8, 128}) {
        SCOPED_TRACE(D);
        const int64_t rows = 2 * 3 * 4;  // B=2, T=3, H=4
        const float eps = 1e-6f;
        auto x = random_vector(rows * D, 1, 3.0f);
        const auto w = norm_weight(D, 2);
        std::vector<float> out(rows * D), rstd(rows);
        cpu::head_rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, D, eps);
        for (int64_t n = 0; n < rows; ++n) {
            double ms = 0.0;
            for (int c = 0; c < D; ++c) ms += static_cast<double>(x[n * D + c]) * x[n * D + c];
            const double ref_rstd = 1.0 / std::sqrt(ms / D + eps);
            EXPECT_TRUE(Near(rstd[n], ref_rstd, 1e-6, 0)) << "row " << n;
            for (int c = 0; c < D; ++c)
                EXPECT_TRUE(Near(out[n * D + c], w[c] * x[n * D + c] * ref_rstd, 1e-6, 1e-7)) << n << "," << c;
        }
        // in place: the same bits
        std::vector<float> inplace = x, rstd2(rows);
        cpu::head_rmsnorm_forward(inplace.data(), rstd2.data(), inplace.data(), w.data(), rows, D, eps);
        EXPECT_EQ(inplace, out);
        EXPECT_EQ(rstd2, rstd);
    }
}

TEST(CpuHeadNorm, BackwardMatchesFiniteDifferences) {
    for (const int D : {8, 64}) {
        SCOPED_TRACE(D);
        const int64_t rows = D == 8 ? 12 : 3;
        const float eps = 1e-6f;
        auto x = random_vector(rows * D, 3);
        auto w = norm_weight(D, 4);
        const auto r = random_vector(rows * D, 5);
        std::vector<float> out(rows * D), rstd(rows);
        cpu::head_rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, D, eps);
        std::vector<float> dx(rows * D, 7.0f), dw(D, 0.0f);  // dx is written (its 7s must go), dw accumulated
        cpu::head_rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), rows, D);
        auto loss = [&] {
            cpu::head_rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, D, eps);
            return weighted_sum(out, r);
        };
        expect_gradient("dx", x, dx, loss);
        expect_gradient("dweight", w, dw, loss);
    }
}

TEST(CpuHeadNorm, BackwardAccumulatesTheWeightGradientAndRunsInPlace) {
    const int64_t rows = 40;
    const int D = 16;
    const auto x = random_vector(rows * D, 6), w = norm_weight(D, 7), dy = random_vector(rows * D, 8);
    const auto dw0 = random_vector(D, 9);
    std::vector<float> out(rows * D), rstd(rows);
    cpu::head_rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, D, 1e-5f);

    std::vector<float> dx(rows * D), dw_zero(D, 0.0f), dw = dw0;
    cpu::head_rmsnorm_backward(dx.data(), dw_zero.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, D);
    cpu::head_rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, D);
    for (int c = 0; c < D; ++c) EXPECT_EQ(dw[c], dw0[c] + dw_zero[c]) << c;  // one += of the same sum

    // dinp aliasing dout: the same bits, and the same weight gradient (read before dout is overwritten)
    std::vector<float> inplace = dy, dw_inplace = dw0;
    cpu::head_rmsnorm_backward(inplace.data(), dw_inplace.data(), inplace.data(), x.data(), w.data(), rstd.data(),
                               rows, D);
    EXPECT_EQ(inplace, dx);
    EXPECT_EQ(dw_inplace, dw);

    // dweight may be null
    std::vector<float> dx_only(rows * D);
    cpu::head_rmsnorm_backward(dx_only.data(), nullptr, dy.data(), x.data(), w.data(), rstd.data(), rows, D);
    EXPECT_EQ(dx_only, dx);
}

// The chain the GPU kernels fuse: RoPE(head_rmsnorm(x)), differentiated as rope_backward then
// head_rmsnorm_backward (the order qk_norm_rope_backward uses), against finite differences.
TEST(CpuHeadNorm, NormThenRopeChainMatchesFiniteDifferences) {
    const int B = 2, T = 3, H = 3, D = 8, half = D / 2;
    const int64_t rows = int64_t{B} * T * H;
    const float eps = 1e-6f;
    std::vector<float> cos(T * half), sin(T * half);
    cpu::rope_tables(cos.data(), sin.data(), T, D, 10000.0);
    auto x = random_vector(rows * D, 10), w = norm_weight(D, 11);
    const auto r = random_vector(rows * D, 12);
    std::vector<float> normed(rows * D), out(rows * D), rstd(rows);
    auto loss = [&] {
        cpu::head_rmsnorm_forward(normed.data(), rstd.data(), x.data(), w.data(), rows, D, eps);
        cpu::rope_forward(out.data(), normed.data(), cos.data(), sin.data(), B, T, H, D);
        return weighted_sum(out, r);
    };
    loss();
    std::vector<float> d = r, dw(D, 0.0f);
    cpu::rope_backward(d.data(), d.data(), cos.data(), sin.data(), B, T, H, D);
    cpu::head_rmsnorm_backward(d.data(), dw.data(), d.data(), x.data(), w.data(), rstd.data(), rows, D);
    expect_gradient("dx", x, d, loss);
    expect_gradient("dweight", w, dw, loss);
}

}  // namespace
}  // namespace qtrain
