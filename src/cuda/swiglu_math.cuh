// The SwiGLU derivatives, one definition for every kernel that computes them (swiglu.cu, and the
// FP8 path that recomputes them while quantising, fp8_quantize.cu): the same expression inlined in
// both gives the same bits, which that path's bit-exact test relies on.
#pragma once

namespace qtrain::cuda {

__device__ __forceinline__ float swiglu_sigmoid(float g) { return 1.0f / (1.0f + __expf(-g)); }

// out = silu(g) * u = g * sigmoid(g) * u; given d = d(out): dg = d(out)/dg, du = d(out)/du.
__device__ __forceinline__ void swiglu_grads(float d, float g, float u, float& dg, float& du) {
    const float s = swiglu_sigmoid(g);
    dg = d * u * s * (1.0f + g * (1.0f - s));
    du = d * g * s;
}

}  // namespace qtrain::cuda
