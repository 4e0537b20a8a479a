// Element types and their host-side conversions. Conversions here are the reference the GPU kernels
// are tested against: bf16 rounds to nearest even, e4m3/e5m2 round to nearest even and saturate to
// the largest finite value (NaN stays NaN), as cuda_fp8's __NV_SATFINITE does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qtrain {

enum class DType : uint8_t { F32, BF16, F16, E4M3, E5M2, I32, U8 };

std::size_t dtype_size(DType t);
inline bool is_fp8(DType t) { return t == DType::E4M3 || t == DType::E5M2; }
// Short names used on the command line: fp32 bf16 fp16 e4m3 e5m2 int32 uint8.
std::string_view dtype_name(DType t);
// Parses a command-line dtype name; `what` names the flag in the error message. `allowed` (e.g.
// "fp32|bf16") restricts the choice; empty allows all floating types.
DType parse_dtype(std::string_view name, std::string_view what, std::string_view allowed = "");

// ---- host conversions ----
uint16_t float_to_bf16(float x);  // round to nearest even; NaN stays (quiet) NaN
float bf16_to_float(uint16_t x);
uint16_t float_to_fp16(float x);  // IEEE half, round to nearest even, overflow to inf
float fp16_to_float(uint16_t x);
uint8_t float_to_e4m3(float x);   // OCP e4m3 (fn): max 448, no inf; saturating
float e4m3_to_float(uint8_t x);
uint8_t float_to_e5m2(float x);   // OCP e5m2: max 57344; saturating (inf -> max)
float e5m2_to_float(uint8_t x);

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;

// Rounds a float through a dtype and back (identity for F32): used to emulate storage precision.
float round_through(float x, DType t);

}  // namespace qtrain
