#include "core/fp8_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace qtrain {

namespace {
uint32_t abs_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u & 0x7fffffffu;
}
float float_of(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}
}  // namespace

float fp8_max(DType t) {
    switch (t) {
        case DType::E4M3: return kE4M3Max;
        case DType::E5M2: return kE5M2Max;
        default: throw_error(cat("fp8: not an fp8 dtype: ", dtype_name(t), " (expected e4m3 or e5m2)"));
    }
}

float fp8_abs_max(const float* x, int64_t n) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, abs_bits(x[i]));
    return float_of(m);
}

Fp8Scale fp8_scale_from_amax(float amax, DType fp8_type) {
    const float fmax = fp8_max(fp8_type);
    Fp8Scale s;
    if (amax > 0.0f && std::isfinite(amax)) {
        s.scale = std::min(fmax / amax, kFp8MaxScale);  // fmax / subnormal is inf or huge: clamped
    }
    s.inv = 1.0f / s.scale;
    return s;
}

uint8_t fp8_quantize_value(float x, float scale, DType t) {
    const float v = x * scale;
    return t == DType::E4M3 ? float_to_e4m3(v) : float_to_e5m2(v);
}

float fp8_decode(uint8_t q, DType t) {
    QT_CHECK(is_fp8(t), "fp8_decode: not an fp8 dtype: ", dtype_name(t));
    return t == DType::E4M3 ? e4m3_to_float(q) : e5m2_to_float(q);
}

void fp8_quantize(uint8_t* out, DType t, const float* in, int64_t n, float scale) {
    fp8_max(t);  // validates t
    for (int64_t i = 0; i < n; ++i) out[i] = fp8_quantize_value(in[i], scale, t);
}

void fp8_quantize_transpose(uint8_t* out, DType t, const float* in, int64_t rows, int64_t cols, float scale) {
    fp8_max(t);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = fp8_quantize_value(in[r * cols + c], scale, t);
}

void fp8_dequantize(float* out, const uint8_t* q, DType t, int64_t n, float inv) {
    for (int64_t i = 0; i < n; ++i) out[i] = inv * fp8_decode(q[i], t);
}

Fp8Tensor fp8_quantize_tensor(const std::vector<float>& x, DType t) {
    Fp8Tensor r;
    r.amax = fp8_abs_max(x.data(), static_cast<int64_t>(x.size()));
    r.scale = fp8_scale_from_amax(r.amax, t);
    r.q.resize(x.size());
    fp8_quantize(r.q.data(), t, x.data(), static_cast<int64_t>(x.size()), r.scale.scale);
    return r;
}

void fp8_gemm_reference(float* out, const uint8_t* a, DType a_type, float a_inv, const uint8_t* b, DType b_type,
                        float b_inv, const float* bias, int64_t M, int64_t N, int64_t K, float beta) {
    // decode once (256 codes) and the operands once, then plain double dot products
    std::vector<double> a_lut(256), b_lut(256);
    for (int c = 0; c < 256; ++c) {
        a_lut[c] = fp8_decode(static_cast<uint8_t>(c), a_type);
        b_lut[c] = fp8_decode(static_cast<uint8_t>(c), b_type);
    }
    std::vector<double> ad(static_cast<std::size_t>(M * K)), bd(static_cast<std::size_t>(N * K));
    for (int64_t i = 0; i < M * K; ++i) ad[i] = a_lut[a[i]];
    for (int64_t i = 0; i < N * K; ++i) bd[i] = b_lut[b[i]];
    const double s = static_cast<double>(a_inv) * static_cast<double>(b_inv);
    for (int64_t i = 0; i < M; ++i) {
        const double* ar = ad.data() + i * K;
        for (int64_t j = 0; j < N; ++j) {
            const double* br = bd.data() + j * K;
            double acc = 0.0;
            for (int64_t k = 0; k < K; ++k) acc += ar[k] * br[k];
            double v = s * acc;
            if (bias) v += bias[j];
            if (beta != 0.0f) v += static_cast<double>(beta) * out[i * N + j];
            out[i * N + j] = static_cast<float>(v);
        }
    }
}

}  // namespace qtrain
