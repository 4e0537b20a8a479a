// The LoRA ops of the CPU reference model: four small GEMMs through cpu::gemm (deterministic).
#include "model/cpu/cpu_ops.h"

namespace qtrain::cpu {

void lora_forward(float* y, float* h, const float* x, const float* A, const float* B, int N, int IC, int OC, int r,
                  float scale) {
    gemm(false, true, N, r, IC, 1.0f, x, IC, A, IC, 0.0f, h, r);
    // PEFT: result + lora_B(lora_A(x)) * scaling
    gemm(false, true, N, OC, r, scale, h, r, B, r, 1.0f, y, OC);
}

void lora_backward(float* dx, float* dA, float* dB, float* dh, const float* dy, const float* x, const float* h,
                   const float* A, const float* B, int N, int IC, int OC, int r, float scale) {
    gemm(false, false, N, r, OC, scale, dy, OC, B, r, 0.0f, dh, r);
    gemm(true, false, OC, r, N, scale, dy, OC, h, r, 1.0f, dB, r);
    gemm(true, false, r, IC, N, 1.0f, dh, r, x, IC, 1.0f, dA, IC);
    if (dx) gemm(false, false, N, IC, r, 1.0f, dh, r, A, IC, 1.0f, dx, IC);
}

}  // namespace qtrain::cpu
