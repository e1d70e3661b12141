#version 450
#extension GL_GOOGLE_include_directive : require
// IQ2_XXS weights x Q8_K activations (kernels/iquant_types.cpp dot_iq2_xxs_scalar).
// IQ2_XXS: d fp16 @0, then per 32-element sub-block two u32 words: w0 = four 8-bit grid indices,
// w1 = four 7-bit sign indices and a 4-bit scale s in the top bits (66 bytes per 256).
#include "linear_common.glsl"
#include "iq2_common.glsl"

void main() {
  const uint r = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (r >= p.rows || t >= p.n) return;
  uint wo = p.w_off + (p.row0 + r) * p.w_row_bytes, ao = t * p.a_stride;
  float sumf = 0.0;
  for (uint b = 0u; b < p.cols / 256u; ++b, wo += 66u, ao += 292u) {
    int bsum = 0;
    for (uint ib = 0u; ib < 8u; ++ib) {
      const uint w0 = w_u32(wo + 2u + 8u * ib), w1 = w_u32(wo + 6u + 8u * ib);
      int sumi = 0;
      for (uint l = 0u; l < 4u; ++l)
        sumi += group_dot(0u, (w0 >> (8u * l)) & 255u, (w1 >> (7u * l)) & 127u, ao + 4u + 32u * ib + 8u * l);
      bsum += sumi * int(2u * (w1 >> 28) + 1u);
    }
    sumf = scaled_step(sumf, half_to_float(w_u16(wo)), a_f32(ao), bsum);  // step_iq2
  }
  precise float out_v = 0.125 * sumf;
  store_out(r, t, out_v);
}
