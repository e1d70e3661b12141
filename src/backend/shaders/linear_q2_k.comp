#version 450
#extension GL_GOOGLE_include_directive : require
// Q2_K weights x Q8_K activations (kernels/kquant_types.cpp dot_q2_k_scalar): per 256-element
// super-block the exact integer sums, then min_tail in super-block order.
// Q2_K: scales[16] @0 (min << 4 | scale), qs[64] @16, d fp16 @80, dmin fp16 @82 (84 bytes).
// Q8_K: d f32 @0, qs int8[256] @4, bsums int16[16] @260 (292 bytes).
#include "linear_common.glsl"
#include "kquant_tail.glsl"

void main() {
  const uint r = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (r >= p.rows || t >= p.n) return;
  uint wo = p.w_off + (p.row0 + r) * p.w_row_bytes, ao = t * p.a_stride;
  float sumf = 0.0;
  for (uint b = 0u; b < p.cols / 256u; ++b, wo += 84u, ao += 292u) {
    int summs = 0, isum = 0;
    for (uint k = 0u; k < 16u; ++k) {
      const uint sc = w_byte(wo + k);
      summs += a_s16(ao + 260u + 2u * k) * int(sc >> 4);
      int s = 0;
      for (uint e = 16u * k; e < 16u * k + 16u; ++e) {
        const uint h = e / 128u, j = (e % 128u) / 32u, l = e % 32u;
        s += a_sbyte(ao + 4u + e) * int((w_byte(wo + 16u + 32u * h + l) >> (2u * j)) & 3u);
      }
      isum += int(sc & 15u) * s;
    }
    sumf = min_tail(sumf, a_f32(ao), half_to_float(w_u16(wo + 80u)), half_to_float(w_u16(wo + 82u)), isum, summs);
  }
  store_out(r, t, sumf);
}
