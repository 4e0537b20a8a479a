// The fused Qwen3 q/k RMSNorm + RoPE kernels (src/cuda/qk_norm_rope.cu) against the CPU reference
// (cpu::head_rmsnorm_* then cpu::rope_*, on the q and k heads cut out of the fused qkv buffer), on
// fresh random inputs with norm weights far from 1: fp32 tight (rounding-order differences only),
// bf16 at the other kernel tests' tolerance (one rounding of the output; the reference gets the same
// bf16 inputs). Forward (qkv, qk_pre, rstd, v untouched) and backward (d_qkv's q/k/v parts, dw_q and
// dw_k accumulated onto nonzero values), the FP8 gradient abs-max over the whole d_qkv, determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda/kernels.h"
#include "gpu_test_util.h"
#include "qk_norm_rope_reference.h"

using namespace qtrain;
using namespace qtrain::test;

namespace {

struct Shape {
    int B, T, Hq, Hkv, D;
};

std::string name(const Shape& s) {
    return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " Hq=" + std::to_string(s.Hq) +
           " Hkv=" + std::to_string(s.Hkv) + " D=" + std::to_string(s.D);
}


float abs_max(const std::vector<float>& v) {
    float m = 0.0f;
    for (float x : v) m = std::max(m, std::fabs(x));
    return m;
}

// `host` stored as dtype `offset` elements into a device buffer: offset 1 makes every row start off
// 16-byte alignment, so the kernels must take their scalar path.
class ShiftedBuffer {
public:
    ShiftedBuffer(const std::vector<float>& host, DType dtype, int offset)
        : buf_(padded(host, offset), dtype), offset_(offset) {}
    void* get() const { return static_cast<char*>(buf_.get()) + static_cast<std::size_t>(offset_) * dtype_size(buf_.dtype()); }
    std::vector<float> download() const {
        auto all = buf_.download();
        return std::vector<float>(all.begin() + offset_, all.end());
    }

private:
    static std::vector<float> padded(const std::vector<float>& host, int offset) {
        std::vector<float> p(static_cast<std::size_t>(offset), 0.0f);
        p.insert(p.end(), host.begin(), host.end());
        return p;
    }
    DeviceBuffer buf_;
    int offset_;
};

class QkNormRopeKernel : public DtypeKernelTest {
protected:
    // Forward and backward of one shape against the reference; `offset` shifts qkv and d_qkv (1: the
    // scalar path). Every output buffer starts as NaN (0xFF bytes), so anything left unwritten fails.
    void check(const Shape& sh, int offset, uint64_t seed) {
        const int B = sh.B, T = sh.T, Hq = sh.Hq, Hkv = sh.Hkv, D = sh.D, N = B * T;
        const int H2 = Hq + Hkv, stride = (Hq + 2 * Hkv) * D, qw = Hq * D, kw = Hkv * D;
        const float eps = 1e-6f;
        const std::size_t n_qkv = static_cast<std::size_t>(N) * stride, n_qk = static_cast<std::size_t>(N) * H2 * D;
        auto where = [&](int width) {  // names element i of an [N, width] matrix of heads
            return [=](std::size_t i) {
                const std::size_t n = i / width, c = i % width;
                return "token " + std::to_string(n) + " head " + std::to_string(c / D) + " d " + std::to_string(c % D);
            };
        };

        const auto qkv = in(random_vector(n_qkv, seed, 3.0f));  // scale 3: rstd far from 1
        const auto wq = in(norm_weight(D, seed + 1)), wk = in(norm_weight(D, seed + 2));
        const QkvDims dims{B, T, Hq, Hkv, D};
        const RopeTables rt(T, D);

        // ---- reference forward: q [N, Hq, D] and k [N, Hkv, D] normalised, then rotated ----
        const QkNormRopeForward ref = qk_norm_rope_reference_forward(dims, qkv, wq, wk, rt, eps, nullptr);
        auto want_qkv = qkv;
        paste(want_qkv, ref.q, N, stride, 0, qw);
        paste(want_qkv, ref.k, N, stride, qw, kw);
        std::vector<float> want_pre(n_qk), want_rstd(static_cast<std::size_t>(N) * H2);
        paste(want_pre, ref.q_pre, N, H2 * D, 0, qw);
        paste(want_pre, ref.k_pre, N, H2 * D, qw, kw);
        paste(want_rstd, ref.rq, N, H2, 0, Hq);
        paste(want_rstd, ref.rk, N, H2, Hq, Hkv);

        // ---- GPU forward ----
        DeviceBuffer gwq(wq, act()), gwk(wk, act()), gcs(rt.cs, DType::F32);
        auto forward = [&](ShiftedBuffer& g, DeviceBuffer& pre, DeviceBuffer& rstd) {
            pre.fill_bytes(0xFF);
            rstd.fill_bytes(0xFF);
            cuda::qk_norm_rope_forward(act(), g.get(), pre.get(), rstd.f32(), gwq.get(), gwk.get(), gcs.f32(), B, T,
                                       Hq, Hkv, D, eps, nullptr);
            sync_device();
        };
        ShiftedBuffer g(qkv, act(), offset);
        DeviceBuffer gpre(n_qk, act()), grstd(static_cast<std::size_t>(N) * H2, DType::F32);
        forward(g, gpre, grstd);
        const auto out = g.download(), pre = gpre.download(), rstd = grstd.download();
        EXPECT_TRUE(AllClose("forward q", cut(out, N, stride, 0, qw), ref.q, tol(1e-5, 8e-3), 0, 0, where(qw)));
        EXPECT_TRUE(AllClose("forward k", cut(out, N, stride, qw, kw), ref.k, tol(1e-5, 8e-3), 0, 0, where(kw)));
        EXPECT_EQ(cut(out, N, stride, qw + kw, kw), cut(qkv, N, stride, qw + kw, kw)) << "v must be untouched";
        EXPECT_EQ(pre, want_pre) << "qk_pre must be the pre-norm q|k exactly as stored";
        EXPECT_TRUE(AllClose("rstd", rstd, want_rstd, 1e-5, 0));  // fp32 math on identical inputs

        {  // deterministic: a second run gives the same bits; without qk_pre/rstd the same qkv
            ShiftedBuffer g2(qkv, act(), offset), g3(qkv, act(), offset);
            DeviceBuffer gpre2(n_qk, act()), grstd2(static_cast<std::size_t>(N) * H2, DType::F32);
            forward(g2, gpre2, grstd2);
            EXPECT_EQ(g2.download(), out);
            EXPECT_EQ(gpre2.download(), pre);
            EXPECT_EQ(grstd2.download(), rstd);
            cuda::qk_norm_rope_forward(act(), g3.get(), nullptr, nullptr, gwq.get(), gwk.get(), gcs.f32(), B, T, Hq,
                                       Hkv, D, eps, nullptr);
            EXPECT_EQ(g3.download(), out);
        }

        // ---- reference backward: inverse rotation, then the norm backward at the stored q|k ----
        const auto d = in(random_vector(n_qkv, seed + 3));
        const auto dwq0 = random_vector(D, seed + 4), dwk0 = random_vector(D, seed + 5);
        const QkNormRopeBackward dref = qk_norm_rope_reference_backward(dims, d, ref, wq, wk, dwq0, dwk0, rt, nullptr);

        // ---- GPU backward, from the GPU forward's qk_pre and rstd ----
        const std::size_t scratch_floats = cuda::qk_norm_rope_backward_scratch_floats(B, T, Hq, Hkv, D);
        struct Grads {
            std::vector<float> d, dwq, dwk;
        };
        auto backward = [&](const std::vector<float>& dy, float* amax) {
            ShiftedBuffer gd(dy, act(), offset);
            DeviceBuffer gdwq(dwq0, DType::F32), gdwk(dwk0, DType::F32), scratch(scratch_floats, DType::F32);
            scratch.fill_bytes(0xFF);  // a partial the reduction reads but no block wrote shows as NaN
            cuda::qk_norm_rope_backward(act(), gd.get(), gdwq.f32(), gdwk.f32(), scratch.f32(), gpre.get(),
                                        grstd.f32(), gwq.get(), gwk.get(), gcs.f32(), B, T, Hq, Hkv, D, nullptr, amax);
            sync_device();
            return Grads{gd.download(), gdwq.download(), gdwk.download()};
        };
        const Grads got = backward(d, nullptr);
        EXPECT_TRUE(AllClose("d q", cut(got.d, N, stride, 0, qw), dref.dq, tol(1e-5, 8e-3), 0, 0, where(qw)));
        EXPECT_TRUE(AllClose("d k", cut(got.d, N, stride, qw, kw), dref.dk, tol(1e-5, 8e-3), 0, 0, where(kw)));
        EXPECT_EQ(cut(got.d, N, stride, qw + kw, kw), cut(d, N, stride, qw + kw, kw)) << "dv must be untouched";
        EXPECT_TRUE(AllClose("dw_q", got.dwq, dref.dwq, 1e-5, 0));  // fp32 accumulation both ways
        EXPECT_TRUE(AllClose("dw_k", got.dwk, dref.dwk, 1e-5, 0));

        // deterministic, and the fused abs-max changes nothing: same bits every run
        const Grads again = backward(d, nullptr);
        EXPECT_EQ(again.d, got.d);
        EXPECT_EQ(again.dwq, got.dwq);
        EXPECT_EQ(again.dwk, got.dwk);
        DeviceBuffer amax(std::vector<float>{-1.0f, 0, 0, 0}, DType::F32);  // the launcher resets it
        const Grads with_amax = backward(d, amax.f32());
        EXPECT_EQ(with_amax.d, got.d);
        EXPECT_EQ(with_amax.dwq, got.dwq);
        EXPECT_EQ(with_amax.dwk, got.dwk);
        // rope_backward's contract: max |d_qkv| as stored over the whole tensor, v included
        EXPECT_EQ(amax.download()[0], abs_max(got.d));
        auto d_big = d;  // the largest value in the v part (of the last token): it must still be seen
        d_big[static_cast<std::size_t>(N - 1) * stride + qw + kw + kw / 2 + 1] = -50.0f;
        EXPECT_LT(abs_max(got.d), 50.0f);
        backward(d_big, amax.f32());
        EXPECT_EQ(amax.download()[0], 50.0f) << "the v part of d_qkv is not in the abs-max";
    }
};

}  // namespace

// The shapes: Qwen3 GQA at D=128 with B*T = 74 (no multiple of any block size), D=64 with
// one kv head, Hq == Hkv; D=256 (the vector path with 16 and 32 threads per head); D=20 (D/2 not a
// multiple of the pack: the scalar path).
TEST_P(QkNormRopeKernel, ForwardAndBackwardMatchTheCpuReference) {
    const Shape shapes[] = {{2, 37, 16, 8, 128}, {1, 64, 4, 1, 64}, {3, 19, 4, 4, 128}, {1, 5, 2, 2, 256},
                            {1, 9, 3, 1, 20}};
    uint64_t seed = 100;
    for (const Shape& s : shapes) {
        SCOPED_TRACE(name(s));
        check(s, 0, seed += 10);
    }
}

// Buffers off 16-byte alignment take the scalar path (32 lanes per head row): same results.
TEST_P(QkNormRopeKernel, MisalignedBuffersTakeTheScalarPath) {
    for (const Shape& s : {Shape{2, 37, 16, 8, 128}, Shape{1, 64, 4, 1, 64}}) {
        SCOPED_TRACE(name(s));
        check(s, 1, 200);
    }
}

// More head rows than the backward's ~1024 blocks take in one sweep (2200 tokens x 24 heads): each
// block walks several rows per slot, so the weight-gradient sums cross iterations.
TEST_P(QkNormRopeKernel, ManyTokensWalkSeveralRowsPerBlock) {
    const Shape s{2, 1100, 16, 8, 128};
    SCOPED_TRACE(name(s));
    check(s, 0, 300);
}

TEST_P(QkNormRopeKernel, RefusesAnOddOrTooLargeHeadDim) {
    for (const int D : {7, 514}) {
        EXPECT_ERROR(cuda::qk_norm_rope_forward(act(), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, 1, 1,
                                                D, 1e-6f, nullptr),
                     "head_dim");
        EXPECT_ERROR(cuda::qk_norm_rope_backward(act(), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                 nullptr, nullptr, 1, 1, 1, 1, D, nullptr),
                     "head_dim");
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, QkNormRopeKernel, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });
