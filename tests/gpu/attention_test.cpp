// GPU causal GQA attention (src/cuda/attention.h) against the CPU reference (cpu::attention_forward /
// attention_backward) on fresh random inputs, for every implementation: fp32 (tight tolerance), bf16
// flash attention and bf16 cuDNN attention (reference fed the bf16-rounded inputs; the cuDNN cases skip
// where the build or the machine has no cuDNN backend). Shapes cover T not a multiple of any
// tile (1, 17, 100, 130, 200, 333), T = 1024, B > 1, GQA ratios 1, 2 and 7, head dims 64 and 128.
// Every output buffer starts as NaN (0xFF bytes) with a NaN guard zone behind it, so an element the
// kernels forget to write, or a write past the end, fails the test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/attention.h"
#include "attention_test_util.h"
#include "gpu_test_util.h"
#include "model/cpu/cpu_ops.h"

namespace qtrain {
namespace {

using test::AllClose;
using test::DeviceBuffer;
using test::random_vector;
using namespace test::attention;

struct Case {
    int B, T, Hq, Hkv, D;
    float qk_std;  // std of the random q and k: > 1 makes the softmax sharper
};

// One implementation: the dtype and, for bf16, the backend.
struct Impl {
    DType dtype;
    AttentionBackend backend;
};
const Impl kImpls[] = {
    {DType::F32, AttentionBackend::Flash},
    {DType::BF16, AttentionBackend::Flash},
    {DType::BF16, AttentionBackend::Cudnn},
};

// Skips the test where the backend cannot run (a build without the cuDNN frontend, an old GPU).
#define REQUIRE_BACKEND(impl)                                                      \
    do {                                                                           \
        std::string why_;                                                          \
        if (!attention_backend_available((impl).backend, &why_)) GTEST_SKIP() << why_; \
    } while (0)

// cuDNN refuses some shapes (T = 1 in its backward); the model then runs the flash kernels
// (attention_choice.h). Such a refusal must come as a clear error when the workspace is sized, before
// anything runs; the test skips the shape after checking that.
#define SKIP_SHAPES_CUDNN_REFUSES(impl, s)                                                          \
    do {                                                                                            \
        if ((impl).backend == AttentionBackend::Cudnn) {                                            \
            try {                                                                                   \
                (void)attention_backward_workspace_bytes((impl).dtype, (s), 1, (impl).backend);     \
            } catch (const Error& e_) {                                                             \
                ASSERT_NE(std::string(e_.what()).find("not supported"), std::string::npos) << e_.what(); \
                GTEST_SKIP() << e_.what();                                                          \
            }                                                                                       \
        }                                                                                           \
    } while (0)

AttentionShape shape_of(const Case& c) { return AttentionShape{c.B, c.T, c.Hq, c.Hkv, c.D}; }

// Random fused qkv rows of a case.
std::vector<float> random_qkv(const Case& c, uint64_t seed) { return test::attention::random_qkv(shape_of(c), c.qk_std, seed); }

std::string where_bthd(std::size_t i, const AttentionShape& s, int H) {
    const std::size_t d = i % s.D, h = i / s.D % H, t = i / s.D / H % s.T, b = i / s.D / H / s.T;
    return cat("b=", b, " t=", t, " h=", h, " d=", d);
}
std::string where_bht(std::size_t i, const AttentionShape& s) {
    const std::size_t t = i % s.T, h = i / s.T % s.Hq, b = i / s.T / s.Hq;
    return cat("b=", b, " h=", h, " t=", t);
}

// Forward then backward of one implementation on the GPU (attention_test_util.h).
Result run_gpu(const Impl& impl, const std::vector<float>& qkv, const std::vector<float>& dout,
               const AttentionShape& s) {
    return test::attention::run_gpu(impl.dtype, impl.backend, qkv, dout, s);
}

// Tolerances, as max|gpu - cpu| <= rtol * max|cpu| + atol per tensor (plus a cosine floor for bf16).
//  fp32: the GPU computes the same fp32 formulas; only summation order (dot products over D, sums over
//    up to 1024 keys) and the fast-math exp2/log2/reciprocal (~2 ulp) differ, i.e. errors of a few
//    1e-7 relative per term. 1e-5 (forward) and 2e-5 (backward, whose dS = P (dP - delta) cancels and
//    whose delta is dout.out on the GPU but sum P dP on the CPU) leave a 10x margin. atol covers
//    tensors whose reference is exactly zero (T = 1: dq = dk = 0, the GPU gets ~1e-7 from rounding).
//  bf16: the reference is computed from the same bf16-rounded inputs in fp32, so the differences are
//    the GPU's bf16 roundings: P (and dS) are rounded to bf16 (relative 2^-9 = 0.2%) before the P V,
//    P^T dO, dS^T Q and dS K products, and every output is stored as bf16 (another 0.2%). Those are
//    independent per term, so an output's error is ~0.1-0.5% of its own magnitude and below that of
//    max|ref|; 2e-2 is 4-10x above it yet far below what an indexing or masking bug gives (O(1)).
//    Cosine > 0.9999 allows a 1.4% rms relative error (typical is ~0.2%): it catches errors spread
//    over many elements that stay below the max bound. lse is computed in fp32 from the same bf16
//    inputs (exact products, fp32 sums, P never rounded), so it gets 1e-3.
// (The table itself: tolerances() in attention_test_util.h, shared with attention_doc_test.cpp.)

class AttentionVsCpu : public ::testing::TestWithParam<std::tuple<Impl, Case>> {};

TEST_P(AttentionVsCpu, ForwardAndBackwardMatchReference) {
    QTRAIN_REQUIRE_GPU();
    const auto [impl, c] = GetParam();
    REQUIRE_BACKEND(impl);
    [[maybe_unused]] const DType dtype = impl.dtype;
    [[maybe_unused]] const AttentionBackend be = impl.backend;
    const AttentionShape s = shape_of(c);
    SKIP_SHAPES_CUDNN_REFUSES(impl, s);
    const uint64_t seed = 1000003ull * c.B + 1009ull * c.T + 101ull * c.Hq + 11ull * c.Hkv + c.D;
    std::vector<float> qkv = random_qkv(c, seed);
    std::vector<float> dout = random_vector(tokens(s) * s.Hq * s.D, seed + 1);
    if (dtype == DType::BF16) {  // the reference sees exactly the GPU's inputs
        qkv = test::round_bf16(qkv);
        dout = test::round_bf16(dout);
    }

    const Result gpu = run_gpu(impl, qkv, dout, s);
    const Result ref = run_cpu(qkv, dout, s);
    const Tolerances tol = tolerances(dtype);

    auto in_q = [&](std::size_t i) { return where_bthd(i, s, s.Hq); };
    auto in_kv = [&](std::size_t i) { return where_bthd(i, s, s.Hkv); };
    auto in_lse = [&](std::size_t i) { return where_bht(i, s); };
    EXPECT_TRUE(AllClose("out", gpu.out, ref.out, tol.out.rtol, tol.out.atol, tol.out.min_cosine, in_q));
    EXPECT_TRUE(AllClose("lse", gpu.lse, ref.lse, tol.lse.rtol, tol.lse.atol, tol.lse.min_cosine, in_lse));
    EXPECT_TRUE(AllClose("dq", gpu.d.q, ref.d.q, tol.grad.rtol, tol.grad.atol, tol.grad.min_cosine, in_q));
    EXPECT_TRUE(AllClose("dk", gpu.d.k, ref.d.k, tol.grad.rtol, tol.grad.atol, tol.grad.min_cosine, in_kv));
    EXPECT_TRUE(AllClose("dv", gpu.d.v, ref.d.v, tol.grad.rtol, tol.grad.atol, tol.grad.min_cosine, in_kv));
}

const Case kCases[] = {
    {1, 100, 2, 2, 64, 1.0f},     // GQA ratio 1, T not a multiple of any tile
    {2, 17, 4, 2, 128, 1.0f},     // ratio 2, B > 1, tiny T
    {1, 1, 7, 1, 64, 1.0f},       // T = 1, ratio 7
    {2, 1, 4, 2, 128, 1.0f},      // T = 1, B > 1
    {2, 100, 14, 2, 64, 1.0f},    // Qwen2.5-0.5B heads
    {1, 1024, 14, 2, 64, 1.0f},   // 0.5B at full sequence length
    {2, 1024, 4, 2, 128, 1.0f},   // D = 128 at full sequence length
    {1, 333, 28, 4, 128, 1.0f},   // Qwen2.5-7B heads, ratio 7
    {3, 200, 7, 1, 128, 1.0f},    // ratio 7, B = 3
    {2, 130, 12, 2, 128, 1.0f},   // Qwen2.5-1.5B heads, T just past 128
    {2, 130, 4, 4, 64, 2.5f},     // sharp softmax (scores std ~6)
    {1, 257, 6, 3, 128, 2.5f},    // sharp softmax, D = 128, ratio 2
};

std::string case_name(const ::testing::TestParamInfo<std::tuple<Impl, Case>>& info) {
    const auto& [impl, c] = info.param;
    std::string name = cat(dtype_name(impl.dtype), impl.backend == AttentionBackend::Cudnn ? "_cudnn" : "", "_B", c.B, "_T", c.T, "_Hq", c.Hq, "_Hkv", c.Hkv, "_D", c.D);
    if (c.qk_std != 1.0f) name += "_sharp";
    return name;
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionVsCpu,
                         ::testing::Combine(::testing::ValuesIn(kImpls), ::testing::ValuesIn(kCases)),
                         case_name);

// Two runs on the same inputs give bit-identical out, lse and dqkv (no atomics, fixed reduction order).
class AttentionDeterminism : public ::testing::TestWithParam<std::tuple<Impl, Case>> {};

TEST_P(AttentionDeterminism, RepeatedRunsAreBitIdentical) {
    QTRAIN_REQUIRE_GPU();
    const auto [impl, c] = GetParam();
    REQUIRE_BACKEND(impl);
    [[maybe_unused]] const DType dtype = impl.dtype;
    [[maybe_unused]] const AttentionBackend be = impl.backend;
    const AttentionShape s = shape_of(c);
    SKIP_SHAPES_CUDNN_REFUSES(impl, s);
    const std::vector<float> qkv = random_qkv(c, 77);
    const std::vector<float> dout = random_vector(tokens(s) * s.Hq * s.D, 78);
    const Result a = run_gpu(impl, qkv, dout, s);
    const Result b = run_gpu(impl, qkv, dout, s);
    EXPECT_TRUE(a.out_bytes == b.out_bytes) << "forward out differs between runs";
    EXPECT_TRUE(a.lse_bytes == b.lse_bytes) << "forward lse differs between runs";
    ASSERT_EQ(a.dqkv_bytes.size(), b.dqkv_bytes.size());
    std::size_t differing = 0, first = 0;
    for (std::size_t i = 0; i < a.dqkv_bytes.size(); ++i)
        if (a.dqkv_bytes[i] != b.dqkv_bytes[i] && differing++ == 0) first = i;
    EXPECT_EQ(differing, 0u) << "dqkv differs between runs in " << differing << " bytes, first at byte " << first;
    // And the result is complete (no NaN left from the 0xFF fill).
    const auto nan_count = [](const std::vector<float>& x) {
        std::size_t n = 0;
        for (float v : x) n += !std::isfinite(v);
        return n;
    };
    EXPECT_EQ(nan_count(a.out) + nan_count(a.lse) + nan_count(a.d.q) + nan_count(a.d.k) + nan_count(a.d.v), 0u);
}

const Case kDeterminismCases[] = {
    {4, 1024, 14, 2, 64, 1.0f},
    {2, 777, 12, 2, 128, 1.0f},
};

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionDeterminism,
                         ::testing::Combine(::testing::ValuesIn(kImpls), ::testing::ValuesIn(kDeterminismCases)),
                         case_name);

// --attn-bwd-chunks: the backward over the batch in 1, 2 or 4 chunks of sequences (each with a
// workspace sized for one chunk, NaN-filled with a guard zone) gives bit-identical dqkv; every
// sequence's attention is independent, so chunking changes only which launch computes it.
class AttentionBackwardChunks : public ::testing::TestWithParam<std::tuple<Impl, Case>> {};

TEST_P(AttentionBackwardChunks, ChunkedBackwardIsBitIdentical) {
    QTRAIN_REQUIRE_GPU();
    const auto [impl, c] = GetParam();
    REQUIRE_BACKEND(impl);
    [[maybe_unused]] const DType dtype = impl.dtype;
    [[maybe_unused]] const AttentionBackend be = impl.backend;
    const AttentionShape s = shape_of(c);
    SKIP_SHAPES_CUDNN_REFUSES(impl, s);
    const std::size_t es = dtype_size(dtype);
    const std::size_t n_out = tokens(s) * s.Hq * s.D, n_lse = static_cast<std::size_t>(s.B) * s.Hq * s.T;
    const std::vector<float> qkv = random_qkv(c, 4242 + c.B + c.T);
    const std::vector<float> dout = random_vector(n_out, 4343 + c.B + c.T);
    DeviceBuffer d_qkv(qkv, dtype), d_dout(dout, dtype);
    DeviceBuffer d_out = nan_buffer(n_out * es), d_lse = nan_buffer(n_lse * 4);
    DeviceBuffer d_fws = nan_buffer(attention_backward_workspace_bytes(dtype, s, 1, be));
    attention_forward(dtype, d_out.get(), d_lse.as<float>(), d_qkv.get(), s, nullptr, nullptr, be, d_fws.get());
    test::sync_device();

    auto backward = [&](int chunks) {
        const std::size_t ws_bytes = attention_backward_workspace_bytes(dtype, s, chunks, be);
        if (be == AttentionBackend::Flash)  // cuDNN sizes its own
            EXPECT_GE(ws_bytes, static_cast<std::size_t>(s.B / chunks) * s.Hq * s.T * sizeof(float));
        DeviceBuffer d_ws = nan_buffer(ws_bytes), d_dqkv = nan_buffer(qkv.size() * es);
        attention_backward(dtype, d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.as<float>(), d_ws.get(),
                           s, nullptr, chunks, be);
        test::sync_device();
        EXPECT_TRUE(GuardIntact("dqkv", d_dqkv)) << chunks << " chunks";
        EXPECT_TRUE(GuardIntact("workspace", d_ws)) << chunks << " chunks";
        return test::to_host<uint8_t>(d_dqkv.get(), qkv.size() * es);
    };
    const std::vector<uint8_t> whole = backward(1);
    // complete (no NaN left from the 0xFF fill), so the comparisons below compare real values
    std::size_t non_finite = 0;
    for (std::size_t i = 0; i < qkv.size(); ++i) {
        float v;
        if (dtype == DType::BF16) {
            uint16_t u;
            std::memcpy(&u, whole.data() + 2 * i, 2);
            v = bf16_to_float(u);
        } else {
            std::memcpy(&v, whole.data() + 4 * i, 4);
        }
        non_finite += !std::isfinite(v);
    }
    ASSERT_EQ(non_finite, 0u) << "dqkv with 1 chunk is incomplete";
    for (int chunks : {2, 4}) {
        if (s.B % chunks != 0) continue;
        const std::vector<uint8_t> part = backward(chunks);
        ASSERT_EQ(part.size(), whole.size());
        std::size_t differing = 0, first = 0;
        for (std::size_t i = 0; i < whole.size(); ++i)
            if (whole[i] != part[i] && differing++ == 0) first = i;
        EXPECT_EQ(differing, 0u) << chunks << " chunks: dqkv differs from 1 chunk in " << differing
                                 << " bytes, first at byte " << first << " (token "
                                 << first / es / qkv_width(s) << ")";
    }
}

const Case kChunkCases[] = {
    {4, 100, 14, 2, 64, 1.0f},   // 0.5B heads, T not a multiple of any tile
    {4, 257, 12, 2, 128, 1.0f},  // 1.5B heads, D = 128
    {2, 64, 4, 4, 64, 2.5f},     // B = 2 (chunks 2 only), ratio 1, sharp softmax
};

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionBackwardChunks,
                         ::testing::Combine(::testing::ValuesIn(kImpls), ::testing::ValuesIn(kChunkCases)),
                         case_name);

// Argument validation happens on the host before anything touches the device, so this runs anywhere.
TEST(AttentionArgs, RejectsUnsupportedShapesAndTypes) {
    float dummy[4];
    EXPECT_ERROR(attention_forward(DType::BF16, dummy, dummy, dummy, {1, 8, 2, 2, 96}, nullptr), "head dim");
    EXPECT_ERROR(attention_forward(DType::F32, dummy, dummy, dummy, {1, 8, 2, 2, 32}, nullptr), "head dim");
    EXPECT_ERROR(attention_forward(DType::F16, dummy, dummy, dummy, {1, 8, 2, 2, 64}, nullptr), "dtype");
    EXPECT_ERROR(attention_forward(DType::BF16, dummy, dummy, dummy, {1, 8, 3, 2, 64}, nullptr), "multiple");
    EXPECT_ERROR(attention_forward(DType::BF16, dummy, dummy, dummy, {1, 0, 2, 2, 64}, nullptr), "bad shape");
    EXPECT_ERROR(attention_backward_workspace_bytes(DType::BF16, {1, 8, 2, 2, 80}), "head dim");
    EXPECT_ERROR(attention_backward(DType::BF16, dummy, dummy, dummy, dummy, dummy, dummy, {1, 8, 2, 2, 256}, nullptr),
                 "head dim");
}

TEST(AttentionArgs, WorkspaceHoldsOneFloatPerQueryRow) {
    const AttentionShape s{3, 100, 14, 2, 64};
    EXPECT_GE(attention_backward_workspace_bytes(DType::BF16, s), 3u * 14u * 100u * sizeof(float));
    EXPECT_GE(attention_backward_workspace_bytes(DType::F32, s), 3u * 14u * 100u * sizeof(float));
}

// The chunked backward's workspace holds one chunk (B / chunks sequences); chunks must divide B.
TEST(AttentionArgs, ChunkedWorkspaceHoldsOneChunk) {
    const AttentionShape s{8, 1024, 14, 2, 64};
    const std::size_t row_bytes = 14u * 1024u * sizeof(float);  // one sequence's delta
    for (DType dtype : {DType::BF16, DType::F32}) {
        EXPECT_EQ(attention_backward_workspace_bytes(dtype, s), 8 * row_bytes);
        EXPECT_EQ(attention_backward_workspace_bytes(dtype, s, 1), 8 * row_bytes);
        EXPECT_EQ(attention_backward_workspace_bytes(dtype, s, 2), 4 * row_bytes);
        EXPECT_EQ(attention_backward_workspace_bytes(dtype, s, 8), 1 * row_bytes);
    }
    EXPECT_ERROR(attention_backward_workspace_bytes(DType::BF16, s, 3), "batch size 8 is not divisible by 3 chunks");
    EXPECT_ERROR(attention_backward_workspace_bytes(DType::BF16, s, 0), "chunks must be >= 1");
    float dummy[4];
    EXPECT_ERROR(attention_backward(DType::BF16, dummy, dummy, dummy, dummy, dummy, dummy, s, nullptr, 16),
                 "not divisible by 16 chunks");
}

}  // namespace
}  // namespace qtrain
