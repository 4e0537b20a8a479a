#include "core/dtype.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace qtrain {

std::size_t dtype_size(DType t) {
    switch (t) {
        case DType::F32: return 4;
        case DType::BF16: return 2;
        case DType::F16: return 2;
        case DType::E4M3: return 1;
        case DType::E5M2: return 1;
        case DType::I32: return 4;
        case DType::U8: return 1;
    }
    return 0;
}

std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "fp32";
        case DType::BF16: return "bf16";
        case DType::F16: return "fp16";
        case DType::E4M3: return "e4m3";
        case DType::E5M2: return "e5m2";
        case DType::I32: return "int32";
        case DType::U8: return "uint8";
    }
    return "?";
}

DType parse_dtype(std::string_view name, std::string_view what, std::string_view allowed) {
    static constexpr DType kFloatTypes[] = {DType::F32, DType::BF16, DType::F16, DType::E4M3, DType::E5M2};
    std::string allowed_list = allowed.empty() ? "fp32|bf16|fp16|e4m3|e5m2" : std::string(allowed);
    for (DType t : kFloatTypes) {
        if (dtype_name(t) != name) continue;
        // check membership in the '|'-separated allowed list
        std::string_view rest = allowed_list;
        while (!rest.empty()) {
            auto bar = rest.find('|');
            if (rest.substr(0, bar) == name) return t;
            if (bar == std::string_view::npos) break;
            rest.remove_prefix(bar + 1);
        }
    }
    throw_error(cat(what, ": unknown or unsupported dtype '", name, "' (expected one of ", allowed_list, ")"));
}

static uint32_t bits_of(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
static float float_of(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

uint16_t float_to_bf16(float x) {
    uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return static_cast<uint16_t>(u >> 16);
}

float bf16_to_float(uint16_t x) { return float_of(static_cast<uint32_t>(x) << 16); }

uint16_t float_to_fp16(float x) {
    uint32_t u = bits_of(x);
    uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    float a = std::fabs(x);
    if (std::isnan(x)) return static_cast<uint16_t>(sign | 0x7e00u);
    if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
    if (a < 6.103515625e-05f) {                                       // subnormal (or zero)
        float q = std::nearbyint(a * 16777216.0f);                    // units of 2^-24
        return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
    }
    int e;
    float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    float q = std::nearbyint((m * 2.0f - 1.0f) * 1024.0f);
    int exp = e - 1 + 15;
    uint32_t mant = static_cast<uint32_t>(q);
    if (mant == 1024) { mant = 0; ++exp; }
    return static_cast<uint16_t>(sign | (exp << 10) | mant);
}

float fp16_to_float(uint16_t h) {
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    float v;
    if (exp == 0) v = std::ldexp(static_cast<float>(mant), -24);
    else if (exp == 31) v = mant ? NAN : INFINITY;
    else v = std::ldexp(1.0f + mant / 1024.0f, static_cast<int>(exp) - 15);
    return sign ? -v : v;
}

// Generic saturating encoder for the two OCP fp8 formats (mbits mantissa bits, exponent bias).
static uint8_t float_to_fp8(float x, int mbits, int bias, float max_finite, uint8_t max_code,
                            uint8_t nan_code) {
    uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    if (std::isnan(x)) return static_cast<uint8_t>(sign | nan_code);
    float a = std::fabs(x);
    if (a >= max_finite) return static_cast<uint8_t>(sign | max_code);  // saturate (inf too)
    float min_normal = std::ldexp(1.0f, 1 - bias);
    if (a < min_normal) {
        float q = std::nearbyint(std::ldexp(a, bias - 1 + mbits));  // units of the subnormal step
        return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));  // q == 2^mbits is min normal
    }
    int e;
    float m = std::frexp(a, &e);
    uint32_t mant = static_cast<uint32_t>(std::nearbyint((m * 2.0f - 1.0f) * static_cast<float>(1 << mbits)));
    int exp = e - 1 + bias;
    if (mant == (1u << mbits)) { mant = 0; ++exp; }
    uint32_t code = (static_cast<uint32_t>(exp) << mbits) | mant;
    if (code > max_code) code = max_code;  // rounded past the largest finite value
    return static_cast<uint8_t>(sign | code);
}

static float fp8_to_float(uint8_t v, int mbits, int bias, bool is_e4m3) {
    bool neg = v & 0x80;
    uint32_t exp = (v & 0x7f) >> mbits;
    uint32_t mant = v & ((1u << mbits) - 1);
    float r;
    if (is_e4m3 && (v & 0x7f) == 0x7f) r = NAN;
    else if (!is_e4m3 && exp == 31) r = mant ? NAN : INFINITY;
    else if (exp == 0) r = std::ldexp(static_cast<float>(mant), 1 - bias - mbits);
    else r = std::ldexp(1.0f + static_cast<float>(mant) / static_cast<float>(1 << mbits), static_cast<int>(exp) - bias);
    return neg ? -r : r;
}

uint8_t float_to_e4m3(float x) { return float_to_fp8(x, 3, 7, kE4M3Max, 0x7e, 0x7f); }
float e4m3_to_float(uint8_t x) { return fp8_to_float(x, 3, 7, true); }
uint8_t float_to_e5m2(float x) { return float_to_fp8(x, 2, 15, kE5M2Max, 0x7b, 0x7e); }
float e5m2_to_float(uint8_t x) { return fp8_to_float(x, 2, 15, false); }

float round_through(float x, DType t) {
    switch (t) {
        case DType::F32: return x;
        case DType::BF16: return bf16_to_float(float_to_bf16(x));
        case DType::F16: return fp16_to_float(float_to_fp16(x));
        case DType::E4M3: return e4m3_to_float(float_to_e4m3(x));
        case DType::E5M2: return e5m2_to_float(float_to_e5m2(x));
        default: throw_error(cat("round_through: not a floating dtype: ", dtype_name(t)));
    }
}

}  // namespace qtrain
