#version 450
#extension GL_GOOGLE_include_directive : require
// Q3_K weights x Q8_K activations (kernels/kquant_types.cpp dot_q3_k_scalar). A unit is two of
// the 16-element sub-blocks.
// Q3_K: hmask[32] @0, qs[64] @32, scales[12] @96 (16 packed signed 6-bit), d fp16 @108 (110 bytes).
#define BLOCK_COLS 256u
#define W_BLOCK 110u
#define A_BLOCK 292u
#define UNITS 8
#include "linear_common.glsl"

void unit_sums(uint wo, uint ab, uint u, inout ivec2 s[TOKENS]) {
  for (uint k = 2u * u; k < 2u * u + 2u; ++k) {
    const uint low4 = k < 8u ? (w_byte(wo + 96u + k) & 15u) : (w_byte(wo + 96u + k - 8u) >> 4);
    const uint high2 = (w_byte(wo + 104u + k % 4u) >> (2u * (k / 4u))) & 3u;
    const int sc = int(low4 | (high2 << 4)) - 32;
    int acc[TOKENS];
    for (uint t = 0u; t < TOKENS; ++t) acc[t] = 0;
    for (uint e = 16u * k; e < 16u * k + 16u; ++e) {
      const uint h = e / 128u, j = (e % 128u) / 32u, l = e % 32u;
      const int q2 = int((w_byte(wo + 32u + 32u * h + l) >> (2u * j)) & 3u);
      const uint hbit = (w_byte(wo + l) >> (4u * h + j)) & 1u;
      const int wv = q2 - (hbit != 0u ? 0 : 4);
      for (uint t = 0u; t < TOKENS; ++t) acc[t] += a_tok(t, ab + 4u + e) * wv;
    }
    for (uint t = 0u; t < TOKENS; ++t) s[t].x += sc * acc[t];
  }
}

float block_term(uint wo, uint ao, ivec2 s) { return scaled_term(half_to_float(w_u16(wo + 108u)), a_f32(ao), s.x); }

#include "linear_main.glsl"
