#version 450
#extension GL_GOOGLE_include_directive : require
// F32 / F16 / BF16 weights x F32 activations: kernels/float_types.cpp canonical_dot. 16 lanes
// (lane = i mod 16) accumulate fma(w_i, x_i, lane) over the row zero-padded to 16, then the fixed
// reduction 8-4-2-1 and lane 0 + lane 1.
// The CPU's fma rounds once: fma_rn.glsl computes it exactly. The backend runs this shader only
// on devices with shaderFloat64; elsewhere these weights stay on the CPU.
#include "linear_common.glsl"
#include "fma_rn.glsl"

float weight_at(uint row_off, uint i) {
  if (p.kind == 0u) return uintBitsToFloat(w[(row_off >> 2) + i]);
  const uint h = w_u16(row_off + 2u * i);
  return p.kind == 1u ? half_to_float(h) : uintBitsToFloat(h << 16);
}

void main() {
  const uint r = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (r >= p.rows || t >= p.n) return;
  const uint wo = p.w_off + (p.row0 + r) * p.w_row_bytes, ao = (t * p.a_stride) >> 2;
  precise float acc[16];
  for (uint k = 0u; k < 16u; ++k) acc[k] = 0.0;
  const uint padded = (p.cols + 15u) / 16u * 16u;
  for (uint i = 0u; i < padded; ++i) {
    const float wv = i < p.cols ? weight_at(wo, i) : 0.0;
    const float av = i < p.cols ? uintBitsToFloat(a[ao + i]) : 0.0;
    acc[i % 16u] = fma_rn(wv, av, acc[i % 16u]);
  }
  for (uint width = 8u; width >= 2u; width /= 2u)
    for (uint i = 0u; i < width; ++i) acc[i] = acc[i] + acc[i + width];
  precise float s = acc[0] + acc[1];
  store_out(r, t, s);
}
