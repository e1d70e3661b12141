#version 450
#extension GL_GOOGLE_include_directive : require
// IQ2_XS weights x Q8_K activations (kernels/iquant_types.cpp dot_iq2_xs_scalar).
// IQ2_XS: d fp16 @0, qs u16[32] @2 (9-bit grid index, 7-bit sign index), scales u8[8] @66
// (two 4-bit scales per 32-element sub-block: groups {0,1} low nibble, {2,3} high), 74 bytes.
#include "linear_common.glsl"
#include "iq2_common.glsl"

void main() {
  const uint r = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (r >= p.rows || t >= p.n) return;
  uint wo = p.w_off + (p.row0 + r) * p.w_row_bytes, ao = t * p.a_stride;
  float sumf = 0.0;
  for (uint b = 0u; b < p.cols / 256u; ++b, wo += 74u, ao += 292u) {
    int bsum = 0;
    for (uint ib = 0u; ib < 8u; ++ib) {
      const uint sc = w_byte(wo + 66u + ib);
      int half_sum[2] = int[2](0, 0);
      for (uint l = 0u; l < 4u; ++l) {
        const uint q = w_u16(wo + 2u + 2u * (4u * ib + l));
        half_sum[l / 2u] += group_dot(512u, q & 511u, q >> 9, ao + 4u + 32u * ib + 8u * l);
      }
      bsum += half_sum[0] * int(2u * (sc & 15u) + 1u) + half_sum[1] * int(2u * (sc >> 4) + 1u);
    }
    sumf = scaled_step(sumf, half_to_float(w_u16(wo)), a_f32(ao), bsum);  // step_iq2
  }
  precise float out_v = 0.125 * sumf;
  store_out(r, t, out_v);
}
