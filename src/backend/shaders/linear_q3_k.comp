#version 450
#extension GL_GOOGLE_include_directive : require
// Q3_K weights x Q8_K activations (kernels/kquant_types.cpp dot_q3_k_scalar).
// Q3_K: hmask[32] @0, qs[64] @32, scales[12] @96 (16 packed signed 6-bit), d fp16 @108 (110 bytes).
#include "linear_common.glsl"

void main() {
  const uint r = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (r >= p.rows || t >= p.n) return;
  uint wo = p.w_off + (p.row0 + r) * p.w_row_bytes, ao = t * p.a_stride;
  float sumf = 0.0;
  for (uint b = 0u; b < p.cols / 256u; ++b, wo += 110u, ao += 292u) {
    int isum = 0;
    for (uint k = 0u; k < 16u; ++k) {
      const uint low4 = k < 8u ? (w_byte(wo + 96u + k) & 15u) : (w_byte(wo + 96u + k - 8u) >> 4);
      const uint high2 = (w_byte(wo + 104u + k % 4u) >> (2u * (k / 4u))) & 3u;
      const int s = int(low4 | (high2 << 4)) - 32;
      int acc = 0;
      for (uint e = 16u * k; e < 16u * k + 16u; ++e) {
        const uint h = e / 128u, j = (e % 128u) / 32u, l = e % 32u;
        const int q2 = int((w_byte(wo + 32u + 32u * h + l) >> (2u * j)) & 3u);
        const uint hbit = (w_byte(wo + l) >> (4u * h + j)) & 1u;
        acc += a_sbyte(ao + 4u + e) * (q2 - (hbit != 0u ? 0 : 4));
      }
      isum += s * acc;
    }
    sumf = scaled_step(sumf, half_to_float(w_u16(wo + 108u)), a_f32(ao), isum);
  }
  store_out(r, t, sumf);
}
