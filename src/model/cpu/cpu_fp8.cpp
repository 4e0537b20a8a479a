// FP8 emulation of the CPU reference model: a GEMM operand rounded through e4m3 / e5m2 with the
// GPU's per-tensor current scale (core/fp8_reference.h has the rule the GPU kernels match).
#include <algorithm>

#include "core/fp8_reference.h"
#include "model/cpu/cpu_ops.h"

namespace qtrain::cpu {

void fake_quantize(std::initializer_list<Fp8Part> parts, DType type) {
    float amax = 0.0f;
    for (const Fp8Part& p : parts) amax = std::max(amax, fp8_abs_max(p.in, p.n));
    const Fp8Scale s = fp8_scale_from_amax(amax, type);
    for (const Fp8Part& p : parts) {
#pragma omp parallel for schedule(static) if (p.n > (1 << 16))
        for (int64_t i = 0; i < p.n; ++i) p.out[i] = fp8_decode(fp8_quantize_value(p.in[i], s.scale, type), type) * s.inv;
    }
}

}  // namespace qtrain::cpu
