// Host dtype conversions are the reference every GPU quantization kernel is checked against, so
// they are tested exhaustively (every code) and against a brute-force nearest-value search.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"

namespace qtrain {
namespace {

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
uint32_t to_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---------------------------------------------------------------- bf16

TEST(Bf16, ExactValues) {
    EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
    EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
    EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
    EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
    EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
}

TEST(Bf16, RoundsToNearestEvenOnTies) {
    // 0x3f808000 lies exactly between 0x3f80 (even) and 0x3f81: goes down to the even one.
    EXPECT_EQ(float_to_bf16(from_bits(0x3f808000u)), 0x3f80);
    // 0x3f818000 lies between 0x3f81 and 0x3f82 (even): goes up.
    EXPECT_EQ(float_to_bf16(from_bits(0x3f818000u)), 0x3f82);
    // Off the tie, plain nearest.
    EXPECT_EQ(float_to_bf16(from_bits(0x3f808001u)), 0x3f81);
    EXPECT_EQ(float_to_bf16(from_bits(0x3f807fffu)), 0x3f80);
    // Negative ties behave the same on the magnitude.
    EXPECT_EQ(float_to_bf16(from_bits(0xbf808000u)), 0xbf80);
    EXPECT_EQ(float_to_bf16(from_bits(0xbf818000u)), 0xbf82);
    // Carry out of the mantissa into the exponent.
    EXPECT_EQ(float_to_bf16(from_bits(0x3fffffffu)), 0x4000);
}

TEST(Bf16, InfNaNAndMax) {
    EXPECT_EQ(float_to_bf16(kInf), 0x7f80);
    EXPECT_EQ(float_to_bf16(-kInf), 0xff80);
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(kNaN))));
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(-kNaN))));
    // A NaN whose payload sits only in the low 16 bits must not truncate to inf.
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7f800001u)))));
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0xff800001u)))));
    // Largest bf16 is 0x7f7f; just below its upper half-ulp stays, the tie rounds (to even) to inf.
    EXPECT_EQ(float_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
    EXPECT_EQ(float_to_bf16(from_bits(0x7f7f8000u)), 0x7f80);
    EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
    EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::max()), 0xff80);
}

TEST(Bf16, EveryCodeRoundTrips) {
    for (uint32_t c = 0; c < 0x10000; ++c) {
        const float f = bf16_to_float(static_cast<uint16_t>(c));
        EXPECT_EQ(to_bits(f), c << 16);
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f)))) << std::hex << c;
            continue;
        }
        ASSERT_EQ(float_to_bf16(f), c) << std::hex << c;
    }
}

// ---------------------------------------------------------------- fp16

TEST(Fp16, KnownValues) {
    EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
    EXPECT_EQ(float_to_fp16(-2.0f), 0xc000);
    EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);  // largest finite
    EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);  // below the half-ulp
    EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // tie: to even, which is inf
    EXPECT_EQ(float_to_fp16(1e9f), 0x7c00);
    EXPECT_EQ(float_to_fp16(-kInf), 0xfc00);
    EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
    EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
    EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
    EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(kNaN))));
    EXPECT_EQ(fp16_to_float(0x7c00), kInf);
}

TEST(Fp16, TiesToEven) {
    EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // between 0x3c00 and 0x3c01
    EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // between 0x3c01 and 0x3c02
    EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);             // half the smallest subnormal
    EXPECT_EQ(float_to_fp16(3 * std::ldexp(1.0f, -25)), 0x0002);
    // 1023.5 subnormal steps: ties up into the smallest normal (even mantissa 0).
    EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);
}

TEST(Fp16, EveryCodeRoundTrips) {
    for (uint32_t c = 0; c < 0x10000; ++c) {
        const float f = fp16_to_float(static_cast<uint16_t>(c));
        const bool nan_code = ((c >> 10) & 0x1f) == 0x1f && (c & 0x3ff) != 0;
        EXPECT_EQ(std::isnan(f), nan_code) << std::hex << c;
        if (nan_code) {
            EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f))));
            continue;
        }
        ASSERT_EQ(float_to_fp16(f), c) << std::hex << c;
    }
}

// ---------------------------------------------------------------- fp8

struct Fp8Format {
    const char* name;
    uint8_t (*encode)(float);
    float (*decode)(uint8_t);
    float max;
    uint8_t max_code;
    bool (*is_nan_code)(uint8_t);
    bool (*is_inf_code)(uint8_t);
};

const Fp8Format kE4M3{"e4m3", float_to_e4m3, e4m3_to_float, kE4M3Max, 0x7e,
                      [](uint8_t c) { return (c & 0x7f) == 0x7f; }, [](uint8_t) { return false; }};
const Fp8Format kE5M2{"e5m2", float_to_e5m2, e5m2_to_float, kE5M2Max, 0x7b,
                      [](uint8_t c) { return (c & 0x7f) > 0x7c; }, [](uint8_t c) { return (c & 0x7f) == 0x7c; }};

class Fp8 : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(Fp8, EveryCodeRoundTrips) {
    const Fp8Format& f = GetParam();
    int nans = 0;
    for (int c = 0; c < 256; ++c) {
        const uint8_t code = static_cast<uint8_t>(c);
        const float v = f.decode(code);
        if (f.is_nan_code(code)) {
            ++nans;
            EXPECT_TRUE(std::isnan(v)) << f.name << " code " << c;
            EXPECT_TRUE(std::isnan(f.decode(f.encode(v))));
        } else if (f.is_inf_code(code)) {
            EXPECT_TRUE(std::isinf(v));
            EXPECT_EQ(f.encode(v), (code & 0x80) | f.max_code) << "inf saturates";
        } else {
            EXPECT_EQ(f.encode(v), code) << f.name << " code " << c << " value " << v;
        }
    }
    EXPECT_EQ(nans, f.max == kE4M3Max ? 2 : 6);  // e4m3: S.1111.111 only; e5m2: exp 31 with mantissa 1..3
}

TEST_P(Fp8, PositiveCodesAreIncreasing) {
    const Fp8Format& f = GetParam();
    for (int c = 1; c <= f.max_code; ++c) EXPECT_LT(f.decode(c - 1), f.decode(c)) << c;
    EXPECT_EQ(f.decode(f.max_code), f.max);
    EXPECT_EQ(f.decode(0x80 | f.max_code), -f.max);
}

TEST_P(Fp8, Saturates) {
    const Fp8Format& f = GetParam();
    EXPECT_EQ(f.decode(f.encode(1e9f)), f.max);
    EXPECT_EQ(f.decode(f.encode(-1e9f)), -f.max);
    EXPECT_EQ(f.decode(f.encode(kInf)), f.max);
    EXPECT_EQ(f.decode(f.encode(-kInf)), -f.max);
    EXPECT_EQ(f.decode(f.encode(std::nextafter(f.max, kInf))), f.max);
    EXPECT_TRUE(std::isnan(f.decode(f.encode(kNaN))));
    EXPECT_TRUE(std::isnan(f.decode(f.encode(-kNaN))));
}

// Brute force: the nearest finite code, ties to the even code (the code's LSB is the mantissa's),
// beyond max saturating. The encoder must agree on every midpoint and its neighbours.
uint8_t nearest_code(const Fp8Format& f, float x) {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0;
    const float a = std::fabs(x);
    if (a >= f.max) return sign | f.max_code;
    int best = 0;
    for (int c = 1; c <= f.max_code; ++c) {
        const float d = std::fabs(f.decode(c) - a), db = std::fabs(f.decode(best) - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return static_cast<uint8_t>(sign | best);
}

TEST_P(Fp8, MatchesBruteForceNearestEven) {
    const Fp8Format& f = GetParam();
    std::vector<float> xs;
    for (int c = 0; c < f.max_code; ++c) {
        const float lo = f.decode(c), hi = f.decode(c + 1);
        const float mid = (lo + hi) / 2;  // exact: fp8 values have few bits
        xs.insert(xs.end(), {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf), lo * 1.01f + 1e-12f});
    }
    for (float x : xs) {
        EXPECT_EQ(f.encode(x), nearest_code(f, x)) << f.name << " x=" << x;
        EXPECT_EQ(f.encode(-x), nearest_code(f, -x)) << f.name << " x=" << -x;
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8, ::testing::Values(kE4M3, kE5M2),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Fp8Values, KnownCodes) {
    EXPECT_EQ(float_to_e4m3(448.0f), 0x7e);
    EXPECT_EQ(float_to_e4m3(464.0f), 0x7e);  // would round to 480, which e4m3 does not have
    EXPECT_EQ(float_to_e4m3(1.0f), 0x38);
    EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -9)), 0x01);   // smallest subnormal
    EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie to even: zero
    EXPECT_EQ(float_to_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);
    EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);  // tie between 1 and 1.125
    EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);  // tie between 1.125 and 1.25
    EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
    EXPECT_EQ(float_to_e5m2(57344.0f), 0x7b);
    EXPECT_EQ(float_to_e5m2(61439.0f), 0x7b);
    EXPECT_EQ(float_to_e5m2(1.0f), 0x3c);
    EXPECT_EQ(float_to_e5m2(1.125f), 0x3c);  // tie between 1 and 1.25
    EXPECT_EQ(float_to_e5m2(1.375f), 0x3e);  // tie between 1.25 and 1.5
    EXPECT_EQ(float_to_e5m2(std::ldexp(1.0f, -16)), 0x01);
    EXPECT_EQ(e5m2_to_float(0x7c), kInf);
    EXPECT_EQ(e5m2_to_float(0xfc), -kInf);
}

// ---------------------------------------------------------------- names and helpers

TEST(DType, SizesAndNames) {
    EXPECT_EQ(dtype_size(DType::F32), 4u);
    EXPECT_EQ(dtype_size(DType::BF16), 2u);
    EXPECT_EQ(dtype_size(DType::F16), 2u);
    EXPECT_EQ(dtype_size(DType::E4M3), 1u);
    EXPECT_EQ(dtype_size(DType::E5M2), 1u);
    EXPECT_EQ(dtype_size(DType::I32), 4u);
    EXPECT_EQ(dtype_name(DType::BF16), "bf16");
    EXPECT_EQ(dtype_name(DType::E4M3), "e4m3");
}

TEST(DType, RoundThrough) {
    EXPECT_EQ(round_through(1.1f, DType::F32), 1.1f);
    EXPECT_EQ(round_through(1.1f, DType::BF16), bf16_to_float(float_to_bf16(1.1f)));
    EXPECT_EQ(round_through(1.1f, DType::F16), fp16_to_float(float_to_fp16(1.1f)));
    EXPECT_EQ(round_through(1000.0f, DType::E4M3), 448.0f);
    EXPECT_EQ(round_through(1.1f, DType::E5M2), 1.0f);
    EXPECT_THROW(round_through(1.0f, DType::I32), Error);
}

std::string error_of(std::string_view name, std::string_view what, std::string_view allowed = "") {
    try {
        parse_dtype(name, what, allowed);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

TEST(ParseDType, AcceptsNames) {
    EXPECT_EQ(parse_dtype("fp32", "--x"), DType::F32);
    EXPECT_EQ(parse_dtype("bf16", "--x"), DType::BF16);
    EXPECT_EQ(parse_dtype("fp16", "--x"), DType::F16);
    EXPECT_EQ(parse_dtype("e4m3", "--x"), DType::E4M3);
    EXPECT_EQ(parse_dtype("e5m2", "--x"), DType::E5M2);
    EXPECT_EQ(parse_dtype("bf16", "--model-dtype", "fp32|bf16"), DType::BF16);
    EXPECT_EQ(parse_dtype("fp32", "--model-dtype", "fp32|bf16"), DType::F32);
}

TEST(ParseDType, RejectsWithFlagAndChoices) {
    std::string m = error_of("fp8", "--matmul-dtype");
    EXPECT_NE(m.find("--matmul-dtype"), std::string::npos) << m;
    EXPECT_NE(m.find("'fp8'"), std::string::npos) << m;
    EXPECT_NE(m.find("e4m3"), std::string::npos) << m;
    // Known, but not allowed for this flag.
    m = error_of("e4m3", "--model-dtype", "fp32|bf16");
    EXPECT_NE(m.find("--model-dtype"), std::string::npos) << m;
    EXPECT_NE(m.find("fp32|bf16"), std::string::npos) << m;
    // Integer types are not choices for a precision flag; prefixes and case do not match.
    EXPECT_NE(error_of("int32", "--x"), "(no error)");
    EXPECT_NE(error_of("bf", "--x", "bf16"), "(no error)");
    EXPECT_NE(error_of("BF16", "--x"), "(no error)");
    EXPECT_NE(error_of("", "--x"), "(no error)");
}

}  // namespace
}  // namespace qtrain
