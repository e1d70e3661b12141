#version 450
#extension GL_GOOGLE_include_directive : require
// F32 / F16 / BF16 weights x F32 activations: kernels/float_types.cpp canonical_dot. 16 lanes
// (lane = i mod 16) accumulate fma(w_i, x_i, lane) over the row zero-padded to 16, then the fixed
// reduction 8-4-2-1 and lane 0 + lane 1.
//
// The CPU's fma rounds once. Vulkan lets a device run GLSL's fma as a multiply and an add (lavapipe
// does), so the fused result is computed here from exact parts instead: the product of two floats
// is exact in double, their sum with the lane is rounded to odd in double (TwoSum gives the
// rounding error; an inexact sum with an even last bit moves one ulp toward it), and the final
// conversion to float rounds to nearest. Rounding to odd at 53 >= 2 * 24 + 2 bits makes that one
// correct rounding of w * x + acc (Boldo and Melquiond, "Emulation of FMA and correctly rounded
// sums: proved algorithms using rounding to odd", IEEE TC 2008). The backend runs this shader only
// on devices with shaderFloat64; elsewhere these weights stay on the CPU.
#include "linear_common.glsl"

float fma_rn(float a, float b, float c) {
  precise double p = double(a) * double(b);  // exact: 24 + 24 significant bits
  precise double dc = double(c);
  precise double s = p + dc;
  precise double bb = s - p;
  precise double err = (p - (s - bb)) + (dc - bb);  // TwoSum: p + dc = s + err exactly
  if (err != 0.0 && !isinf(s) && !isnan(s)) {
    uvec2 u = unpackDouble2x32(s);  // x: low word
    if ((u.x & 1u) == 0u) {
      if ((err > 0.0) == (s > 0.0)) {  // one ulp away from zero
        u.x += 1u;
        if (u.x == 0u) u.y += 1u;
      } else {  // one ulp toward zero
        if (u.x == 0u) u.y -= 1u;
        u.x -= 1u;
      }
      s = packDouble2x32(u);
    }
  }
  return float(s);
}

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
