#version 450
#extension GL_GOOGLE_include_directive : require
// TQ2_0 weights x Q8_K activations (kernels/iquant_types.cpp dot_tq2_0_scalar): element e has
// code (qs[32 * (e / 128) + e % 32] >> 2 * ((e % 128) / 32)) & 3, value (code - 1) * d.
// TQ2_0: qs u8[64] @0, d fp16 @64 (66 bytes per 256).
#include "linear_common.glsl"

void main() {
  const uint r = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (r >= p.rows || t >= p.n) return;
  uint wo = p.w_off + (p.row0 + r) * p.w_row_bytes, ao = t * p.a_stride;
  float sumf = 0.0;
  for (uint b = 0u; b < p.cols / 256u; ++b, wo += 66u, ao += 292u) {
    int sumi = 0;
    for (uint e = 0u; e < 256u; ++e) {
      const uint code = (w_byte(wo + 32u * (e / 128u) + e % 32u) >> (2u * ((e % 128u) / 32u))) & 3u;
      sumi += (int(code) - 1) * a_sbyte(ao + 4u + e);
    }
    sumf = scaled_step(sumf, half_to_float(w_u16(wo + 64u)), a_f32(ao), sumi);  // step_tq2_0
  }
  store_out(r, t, sumf);
}
