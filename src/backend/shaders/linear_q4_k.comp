#version 450
#extension GL_GOOGLE_include_directive : require
// Q4_K weights x Q8_K activations (kernels/kquant_types.cpp dot_q4_k_scalar).
// Q4_K: d fp16 @0, dmin fp16 @2, scales[12] @4 (8 scales + 8 mins, 6 bits), qs[128] @16 (144 bytes).
#include "linear_common.glsl"
#include "kquant_tail.glsl"

// kquant_blocks.h unpack_q4k_scales: scale (or min, with m = 1) k of the 12 packed bytes at off.
uint q4k_scale(uint off, uint k, uint m) {
  if (k < 4u) return w_byte(off + k + 4u * m) & 63u;
  return m == 0u ? ((w_byte(off + k + 4u) & 15u) | ((w_byte(off + k - 4u) >> 6) << 4))
                 : ((w_byte(off + k + 4u) >> 4) | ((w_byte(off + k) >> 6) << 4));
}

void main() {
  const uint r = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (r >= p.rows || t >= p.n) return;
  uint wo = p.w_off + (p.row0 + r) * p.w_row_bytes, ao = t * p.a_stride;
  float sumf = 0.0;
  for (uint b = 0u; b < p.cols / 256u; ++b, wo += 144u, ao += 292u) {
    int sumi_min = 0, isum = 0;
    for (uint j = 0u; j < 16u; ++j) sumi_min += a_s16(ao + 260u + 2u * j) * int(q4k_scale(wo + 4u, j / 2u, 1u));
    for (uint k = 0u; k < 8u; ++k) {
      int acc = 0;
      for (uint e = 32u * k; e < 32u * k + 32u; ++e) {
        const uint byte = w_byte(wo + 16u + 32u * (e / 64u) + e % 32u);
        acc += a_sbyte(ao + 4u + e) * int(e % 64u < 32u ? (byte & 15u) : (byte >> 4));
      }
      isum += int(q4k_scale(wo + 4u, k, 0u)) * acc;
    }
    sumf = min_tail(sumf, a_f32(ao), half_to_float(w_u16(wo)), half_to_float(w_u16(wo + 2u)), isum, sumi_min);
  }
  store_out(r, t, sumf);
}
