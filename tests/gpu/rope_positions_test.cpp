// RoPE with document positions (packed rows, Batch::positions): cuda::rope_forward / rope_backward and
// the fused Qwen3 q/k norm + RoPE (cuda::qk_norm_rope_forward / backward) rotate token n by the angle
// of positions[n] instead of n % T. Against the CPU reference (cpu::rope_* with the same positions;
// cpu::head_rmsnorm_* for the norm), fp32 tight and bf16 at the kernel tests' tolerance, on fresh
// random inputs with documents of length 1, short and long ones; vector and scalar paths (D = 64,
// 128 and 20). And positions 0..T-1 per row give bit for bit the result without positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"
#include "model/cpu/cpu_ops.h"
#include "qk_norm_rope_reference.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

// Positions of rows made of documents of these lengths (a row's lengths sum to T), repeated for B rows
// with the lengths rotated by one per row, so rows differ.
std::vector<int32_t> packed_positions(int B, int T, const std::vector<int>& lengths) {
    std::vector<int32_t> pos;
    for (int b = 0; b < B; ++b) {
        int t = 0;
        for (std::size_t i = 0; t < T; ++i) {
            const int len = std::min(lengths[(i + b) % lengths.size()], T - t);
            for (int p = 0; p < len; ++p) pos.push_back(p);
            t += len;
        }
    }
    return pos;
}

std::vector<int32_t> plain_positions(int B, int T) {
    std::vector<int32_t> pos;
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t) pos.push_back(t);
    return pos;
}


class RopePositions : public DtypeKernelTest {
protected:
};

// "token 37 (position 3) head 2 d 5" for element i of an [N, width] matrix of heads of D.
std::function<std::string(std::size_t)> where(int width, int D, const std::vector<int32_t>& pos) {
    return [=](std::size_t i) {
        const std::size_t n = i / width, c = i % width;
        return cat("token ", n, " (position ", pos[n], ") head ", c / D, " d ", c % D);
    };
}

TEST_P(RopePositions, RopeMatchesTheCpuReference) {
    for (const int D : {64, 128, 20}) {  // vector paths, scalar path (D/2 not a multiple of the pack)
        SCOPED_TRACE(cat("D=", D));
        const int B = 2, T = 150, Hq = 4, Hkv = 2, H2 = Hq + Hkv, stride = (Hq + 2 * Hkv) * D, N = B * T;
        const auto pos = packed_positions(B, T, {1, 37, 64, 1, 1, 90});
        const auto qkv = in(random_vector(static_cast<std::size_t>(N) * stride, 31 + D));
        std::vector<float> cs(static_cast<std::size_t>(T) * D);
        cpu::rope_tables(cs.data(), cs.data() + T * D / 2, T, D, 1e6);
        DeviceBuffer g(qkv, act()), gcs(cs, DType::F32), gpos = to_device(pos);
        cuda::rope_forward(act(), g.get(), gcs.f32(), B, T, Hq, Hkv, D, nullptr, gpos.as<int32_t>());
        const auto out = g.download();
        auto qk = cut(qkv, N, stride, 0, H2 * D), want = qk;
        cpu::rope_forward(want.data(), qk.data(), cs.data(), cs.data() + T * D / 2, B, T, H2, D, pos.data());
        EXPECT_TRUE(AllClose("rope forward q|k", cut(out, N, stride, 0, H2 * D), want, tol(1e-6, 8e-3), 0, 0,
                             where(H2 * D, D, pos)));
        EXPECT_TRUE(cut(out, N, stride, H2 * D, Hkv * D) == cut(qkv, N, stride, H2 * D, Hkv * D)) << "v must be untouched";

        // backward: the transpose rotation at the same positions
        const auto d = in(random_vector(static_cast<std::size_t>(N) * stride, 41 + D));
        g.upload(d);
        cuda::rope_backward(act(), g.get(), gcs.f32(), B, T, Hq, Hkv, D, nullptr, nullptr, gpos.as<int32_t>());
        const auto dout = g.download();
        auto dqk = cut(d, N, stride, 0, H2 * D), dwant = dqk;
        cpu::rope_backward(dwant.data(), dqk.data(), cs.data(), cs.data() + T * D / 2, B, T, H2, D, pos.data());
        EXPECT_TRUE(AllClose("rope backward q|k", cut(dout, N, stride, 0, H2 * D), dwant, tol(1e-6, 8e-3), 0, 0,
                             where(H2 * D, D, pos)));

        // positions 0..T-1 are the plain rotation, bit for bit
        const auto plain = plain_positions(B, T);
        DeviceBuffer gplain = to_device(plain), g1(qkv, act()), g2(qkv, act());
        cuda::rope_forward(act(), g1.get(), gcs.f32(), B, T, Hq, Hkv, D, nullptr, gplain.as<int32_t>());
        cuda::rope_forward(act(), g2.get(), gcs.f32(), B, T, Hq, Hkv, D, nullptr);
        EXPECT_TRUE(g1.download() == g2.download()) << "forward with positions 0..T-1 differs from no positions";
        g1.upload(d);
        g2.upload(d);
        cuda::rope_backward(act(), g1.get(), gcs.f32(), B, T, Hq, Hkv, D, nullptr, nullptr, gplain.as<int32_t>());
        cuda::rope_backward(act(), g2.get(), gcs.f32(), B, T, Hq, Hkv, D, nullptr);
        EXPECT_TRUE(g1.download() == g2.download()) << "backward with positions 0..T-1 differs from no positions";
    }
}

TEST_P(RopePositions, QkNormRopeMatchesTheCpuReference) {
    for (const int D : {128, 64, 20}) {
        SCOPED_TRACE(cat("D=", D));
        const int B = 2, T = 97, Hq = 8, Hkv = 2, H2 = Hq + Hkv, stride = (Hq + 2 * Hkv) * D, N = B * T;
        const int qw = Hq * D, kw = Hkv * D;
        const float eps = 1e-6f;
        const auto pos = packed_positions(B, T, {1, 30, 1, 64, 2});
        const auto qkv = in(random_vector(static_cast<std::size_t>(N) * stride, 51 + D, 3.0f));
        const auto wq = in(norm_weight(D, 52 + D)), wk = in(norm_weight(D, 53 + D));
        const QkvDims dims{B, T, Hq, Hkv, D};
        const RopeTables rt(T, D);

        // reference forward
        const QkNormRopeForward ref = qk_norm_rope_reference_forward(dims, qkv, wq, wk, rt, eps, pos.data());

        DeviceBuffer gwq(wq, act()), gwk(wk, act()), gcs(rt.cs, DType::F32), gpos = to_device(pos);
        DeviceBuffer g(qkv, act()), gpre(static_cast<std::size_t>(N) * H2 * D, act()),
            grstd(static_cast<std::size_t>(N) * H2, DType::F32);
        cuda::qk_norm_rope_forward(act(), g.get(), gpre.get(), grstd.f32(), gwq.get(), gwk.get(), gcs.f32(), B, T, Hq,
                                   Hkv, D, eps, nullptr, gpos.as<int32_t>());
        const auto out = g.download();
        EXPECT_TRUE(
            AllClose("forward q", cut(out, N, stride, 0, qw), ref.q, tol(1e-5, 8e-3), 0, 0, where(qw, D, pos)));
        EXPECT_TRUE(
            AllClose("forward k", cut(out, N, stride, qw, kw), ref.k, tol(1e-5, 8e-3), 0, 0, where(kw, D, pos)));

        // reference backward
        const auto d = in(random_vector(static_cast<std::size_t>(N) * stride, 54 + D));
        const auto dwq0 = random_vector(D, 55 + D), dwk0 = random_vector(D, 56 + D);
        const QkNormRopeBackward dref =
            qk_norm_rope_reference_backward(dims, d, ref, wq, wk, dwq0, dwk0, rt, pos.data());
        const std::size_t scratch_floats = cuda::qk_norm_rope_backward_scratch_floats(B, T, Hq, Hkv, D);
        auto backward = [&](const int32_t* p) {
            DeviceBuffer gd(d, act()), gdwq(dwq0, DType::F32), gdwk(dwk0, DType::F32), scratch(scratch_floats, DType::F32);
            cuda::qk_norm_rope_backward(act(), gd.get(), gdwq.f32(), gdwk.f32(), scratch.f32(), gpre.get(), grstd.f32(),
                                        gwq.get(), gwk.get(), gcs.f32(), B, T, Hq, Hkv, D, nullptr, nullptr, p);
            return std::vector<std::vector<float>>{gd.download(), gdwq.download(), gdwk.download()};
        };
        const auto got = backward(gpos.as<int32_t>());
        EXPECT_TRUE(
            AllClose("d q", cut(got[0], N, stride, 0, qw), dref.dq, tol(1e-5, 8e-3), 0, 0, where(qw, D, pos)));
        EXPECT_TRUE(
            AllClose("d k", cut(got[0], N, stride, qw, kw), dref.dk, tol(1e-5, 8e-3), 0, 0, where(kw, D, pos)));
        EXPECT_TRUE(AllClose("dw_q", got[1], dref.dwq, 1e-5, 0));
        EXPECT_TRUE(AllClose("dw_k", got[2], dref.dwk, 1e-5, 0));
        EXPECT_TRUE(backward(gpos.as<int32_t>()) == got) << "not deterministic";

        // positions 0..T-1: bit for bit the result without positions
        const auto plain = plain_positions(B, T);
        DeviceBuffer gplain = to_device(plain), g1(qkv, act()), g2(qkv, act());
        cuda::qk_norm_rope_forward(act(), g1.get(), nullptr, nullptr, gwq.get(), gwk.get(), gcs.f32(), B, T, Hq, Hkv, D,
                                   eps, nullptr, gplain.as<int32_t>());
        cuda::qk_norm_rope_forward(act(), g2.get(), nullptr, nullptr, gwq.get(), gwk.get(), gcs.f32(), B, T, Hq, Hkv, D,
                                   eps, nullptr);
        EXPECT_TRUE(g1.download() == g2.download()) << "forward with positions 0..T-1 differs from no positions";
        EXPECT_TRUE(backward(gplain.as<int32_t>()) == backward(nullptr))
            << "backward with positions 0..T-1 differs from no positions";
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RopePositions, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
