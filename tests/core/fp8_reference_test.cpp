// The host emulation of per-tensor FP8 scaling (core/fp8_reference.h): the scale rules (zero, inf,
// NaN, subnormal and huge amax), the round-trip error bounds of both formats, saturation, the
// transposed layout and the reference FP8 GEMM. The GPU kernels are checked bit for bit against it.
#include "core/fp8_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace qtrain {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> normal_values(std::size_t n, uint64_t seed, float scale) {
    Rng rng(seed);
    std::vector<float> v(n);
    for (auto& x : v) x = scale * rng.normal();
    return v;
}

uint32_t bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}

TEST(Fp8Reference, FormatMax) {
    EXPECT_EQ(fp8_max(DType::E4M3), 448.0f);
    EXPECT_EQ(fp8_max(DType::E5M2), 57344.0f);
    EXPECT_THROW(fp8_max(DType::BF16), Error);
}

TEST(Fp8Reference, AbsMax) {
    const std::vector<float> x = {0.5f, -3.25f, 2.0f, -0.0f, 1e-30f};
    EXPECT_EQ(fp8_abs_max(x.data(), 5), 3.25f);
    EXPECT_EQ(fp8_abs_max(x.data(), 0), 0.0f);
    const std::vector<float> z = {-0.0f, 0.0f, -0.0f};
    EXPECT_EQ(bits(fp8_abs_max(z.data(), 3)), 0u);  // +0, not -0
    const std::vector<float> with_inf = {1.0f, -kInf, 2.0f};
    EXPECT_EQ(fp8_abs_max(with_inf.data(), 3), kInf);
    const std::vector<float> with_nan = {1.0f, kNaN, -kInf};
    EXPECT_TRUE(std::isnan(fp8_abs_max(with_nan.data(), 3)));  // NaN sorts above inf
    const float sub = std::numeric_limits<float>::denorm_min() * 3;
    const std::vector<float> subnormal = {sub, -sub / 3};
    EXPECT_EQ(fp8_abs_max(subnormal.data(), 2), sub);
}

TEST(Fp8Reference, ScaleRules) {
    for (DType t : {DType::E4M3, DType::E5M2}) {
        SCOPED_TRACE(std::string(dtype_name(t)));
        const float fmax = fp8_max(t);
        // all-zero tensor, overflowed tensor: scale 1 (finite)
        for (float amax : {0.0f, -0.0f, kInf, kNaN}) {
            const Fp8Scale s = fp8_scale_from_amax(amax, t);
            EXPECT_EQ(s.scale, 1.0f) << amax;
            EXPECT_EQ(s.inv, 1.0f) << amax;
        }
        // ordinary values: fmax / amax, inv = 1 / scale, both rounded to nearest
        for (float amax : {1.0f, 3.0f, 0.0123f, 1e5f, 1e-12f}) {
            const Fp8Scale s = fp8_scale_from_amax(amax, t);
            EXPECT_EQ(s.scale, fmax / amax) << amax;
            EXPECT_EQ(s.inv, 1.0f / (fmax / amax)) << amax;
            // the largest value lands on the largest code
            EXPECT_EQ(std::fabs(fp8_decode(fp8_quantize_value(amax, s.scale, t), t)), fmax) << amax;
            EXPECT_EQ(std::fabs(fp8_decode(fp8_quantize_value(-amax, s.scale, t), t)), fmax) << amax;
        }
        // tiny and subnormal amax: clamped to 2^100 (never inf), inv normal
        for (float amax : {1e-30f, std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min()}) {
            const Fp8Scale s = fp8_scale_from_amax(amax, t);
            EXPECT_EQ(s.scale, kFp8MaxScale) << amax;
            EXPECT_EQ(s.inv, std::ldexp(1.0f, -100)) << amax;
        }
        // huge amax: scale small but normal, inv finite
        const Fp8Scale big = fp8_scale_from_amax(std::numeric_limits<float>::max(), t);
        EXPECT_TRUE(std::isnormal(big.scale));
        EXPECT_TRUE(std::isfinite(big.inv));
        EXPECT_EQ(std::fabs(fp8_decode(fp8_quantize_value(std::numeric_limits<float>::max(), big.scale, t), t)),
                  fmax);
    }
}

// |dequant(quant(x)) - x| is at most half a unit in the last place of the fp8 value: relative
// 2^-(mbits+1) for normal fp8 values, absolute half the subnormal step below that.
TEST(Fp8Reference, RoundTripErrorBounds) {
    struct Fmt {
        DType t;
        int mbits;
        float min_normal, sub_step;
    };
    for (const Fmt f : {Fmt{DType::E4M3, 3, 0x1p-6f, 0x1p-9f}, Fmt{DType::E5M2, 2, 0x1p-14f, 0x1p-16f}}) {
        for (float mag : {1.0f, 1e-6f, 3e4f}) {
            SCOPED_TRACE(std::string(dtype_name(f.t)) + " magnitude " + std::to_string(mag));
            std::vector<float> x = normal_values(20000, 7, mag);
            const Fp8Tensor q = fp8_quantize_tensor(x, f.t);
            std::vector<float> back(x.size());
            fp8_dequantize(back.data(), q.q.data(), f.t, static_cast<int64_t>(x.size()), q.scale.inv);
            double worst_rel = 0, worst_sub = 0;
            for (std::size_t i = 0; i < x.size(); ++i) {
                const double scaled = std::fabs(static_cast<double>(x[i]) * q.scale.scale);
                const double err = std::fabs(static_cast<double>(back[i]) - x[i]) * q.scale.scale;  // in fp8 units
                if (scaled >= f.min_normal) worst_rel = std::max(worst_rel, err / scaled);
                else worst_sub = std::max(worst_sub, err);
            }
            // + a few fp32 ulps for the rounding of x * scale and of inv
            EXPECT_LE(worst_rel, std::ldexp(1.0, -(f.mbits + 1)) * (1 + 1e-6));
            EXPECT_LE(worst_sub, f.sub_step / 2 * (1 + 1e-6));
            EXPECT_EQ(q.amax, fp8_abs_max(x.data(), static_cast<int64_t>(x.size())));
        }
    }
}

TEST(Fp8Reference, Saturation) {
    // an inf makes the scale 1: finite values keep their magnitude (and saturate above fmax)
    const std::vector<float> x = {1.0f, -kInf, kInf, 500.0f, -1e6f, 0.3f};
    const Fp8Tensor e4 = fp8_quantize_tensor(x, DType::E4M3);
    EXPECT_EQ(e4.scale.scale, 1.0f);
    EXPECT_EQ(e4.q[0], float_to_e4m3(1.0f));
    EXPECT_EQ(e4.q[1], 0xfe);  // -448
    EXPECT_EQ(e4.q[2], 0x7e);  // +448
    EXPECT_EQ(e4.q[3], 0x7e);
    EXPECT_EQ(e4.q[4], 0xfe);
    EXPECT_EQ(e4.q[5], float_to_e4m3(0.3f));
    const Fp8Tensor e5 = fp8_quantize_tensor(x, DType::E5M2);
    EXPECT_EQ(e5.q[1], 0xfb);  // -57344, not -inf
    EXPECT_EQ(e5.q[2], 0x7b);
    EXPECT_EQ(e5.q[3], float_to_e5m2(500.0f));
    EXPECT_EQ(e5.q[4], 0xfb);
    // values rounding just past the largest code saturate rather than overflow
    EXPECT_EQ(fp8_quantize_value(447.0f, 1.01f, DType::E4M3), 0x7e);
    EXPECT_EQ(fp8_quantize_value(-60000.0f, 1.0f, DType::E5M2), 0xfb);
    // NaN stays NaN
    EXPECT_TRUE(std::isnan(fp8_decode(fp8_quantize_value(kNaN, 1.0f, DType::E4M3), DType::E4M3)));
    // an all-zero tensor quantises to zeros with scale 1
    const Fp8Tensor z = fp8_quantize_tensor(std::vector<float>(10, 0.0f), DType::E4M3);
    EXPECT_EQ(z.scale.scale, 1.0f);
    for (uint8_t b : z.q) EXPECT_EQ(b, 0);
}

TEST(Fp8Reference, TransposeIsThePermutedQuantisation) {
    const int64_t rows = 5, cols = 7;
    const std::vector<float> x = normal_values(rows * cols, 3, 2.0f);
    const Fp8Tensor q = fp8_quantize_tensor(x, DType::E4M3);
    std::vector<uint8_t> t(rows * cols);
    fp8_quantize_transpose(t.data(), DType::E4M3, x.data(), rows, cols, q.scale.scale);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(t[c * rows + r], q.q[r * cols + c]);
}

TEST(Fp8Reference, GemmMatchesDequantisedProduct) {
    const int64_t M = 6, N = 5, K = 32;
    const Fp8Tensor a = fp8_quantize_tensor(normal_values(M * K, 11, 3.0f), DType::E4M3);
    const Fp8Tensor b = fp8_quantize_tensor(normal_values(N * K, 12, 0.01f), DType::E5M2);
    std::vector<float> ad(M * K), bd(N * K);
    fp8_dequantize(ad.data(), a.q.data(), DType::E4M3, M * K, 1.0f);
    fp8_dequantize(bd.data(), b.q.data(), DType::E5M2, N * K, 1.0f);
    const std::vector<float> bias = normal_values(N, 13, 1.0f);
    std::vector<float> out(M * N, 0.0f), acc = normal_values(M * N, 14, 1.0f), acc0 = acc;
    fp8_gemm_reference(out.data(), a.q.data(), DType::E4M3, a.scale.inv, b.q.data(), DType::E5M2, b.scale.inv,
                       bias.data(), M, N, K);
    fp8_gemm_reference(acc.data(), a.q.data(), DType::E4M3, a.scale.inv, b.q.data(), DType::E5M2, b.scale.inv,
                       nullptr, M, N, K, 1.0f);
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            double dot = 0;
            for (int64_t k = 0; k < K; ++k) dot += static_cast<double>(ad[i * K + k]) * bd[j * K + k];
            const double prod = dot * a.scale.inv * b.scale.inv;
            EXPECT_NEAR(out[i * N + j], prod + bias[j], 1e-6 * (std::fabs(prod) + std::fabs(bias[j])) + 1e-12);
            EXPECT_NEAR(acc[i * N + j], prod + acc0[i * N + j], 1e-6 * (std::fabs(prod) + std::fabs(acc0[i * N + j])));
        }
}

}  // namespace
}  // namespace qtrain
