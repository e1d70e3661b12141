#version 450
#extension GL_GOOGLE_include_directive : require
// Q2_0 weights x Q8_0 activations (kernels/iquant_types.cpp dot_q2_0_scalar): a 64-element Q2_0
// block (d fp16 @0, 2-bit codes @2, value (code - 1) * d; 18 bytes) spans two Q8_0 blocks, whose
// scaled integer sums are accumulated from +0 (k = 0 then 1) before the weight scale is applied.
#include "linear_common.glsl"

void main() {
  const uint r = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (r >= p.rows || t >= p.n) return;
  uint wo = p.w_off + (p.row0 + r) * p.w_row_bytes, ao = t * p.a_stride;
  precise float sumf = 0.0;
  for (uint b = 0u; b < p.cols / 64u; ++b, wo += 18u, ao += 68u) {
    int s[2] = int[2](0, 0);
    for (uint k = 0u; k < 2u; ++k)
      for (uint j = 0u; j < 32u; ++j) {
        const uint c = 32u * k + j;
        const int code = int((w_byte(wo + 2u + c / 4u) >> (2u * (c % 4u))) & 3u);
        s[k] += (code - 1) * a_sbyte(ao + 34u * k + 2u + j);
      }
    precise float acc = 0.0;
    precise float t0 = half_to_float(a_u16(ao)) * float(s[0]);
    acc = acc + t0;
    precise float t1 = half_to_float(a_u16(ao + 34u)) * float(s[1]);
    acc = acc + t1;
    precise float term = half_to_float(w_u16(wo)) * acc;
    sumf = sumf + term;
  }
  store_out(r, t, sumf);
}
