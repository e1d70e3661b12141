#version 450
#extension GL_GOOGLE_include_directive : require
// Q2_K weights x Q8_K activations (kernels/kquant_types.cpp dot_q2_k_scalar): per 256-element
// super-block the exact integer sums, then min_term, added in super-block order. A unit is two
// of the 16-element sub-blocks.
// Q2_K: scales[16] @0 (min << 4 | scale), qs[64] @16, d fp16 @80, dmin fp16 @82 (84 bytes).
// Q8_K: d f32 @0, qs int8[256] @4, bsums int16[16] @260 (292 bytes).
#define BLOCK_COLS 256u
#define W_BLOCK 84u
#define A_BLOCK 292u
#define UNITS 8
#include "linear_common.glsl"
#include "kquant_tail.glsl"

void unit_sums(uint wo, uint ab, uint u, inout ivec2 s[TOKENS]) {
  for (uint k = 2u * u; k < 2u * u + 2u; ++k) {
    const uint sc = w_byte(wo + k);
    int acc[TOKENS];
    for (uint t = 0u; t < TOKENS; ++t) {
      s[t].y += a16_tok(t, ab + 260u + 2u * k) * int(sc >> 4);
      acc[t] = 0;
    }
    // Element e = 16k + i is bits 2j of byte l of qs's half h (h = e / 128, j = e % 128 / 32,
    // l = e % 32): four elements' codes are four bytes' bits at one shift.
    const uint h = k / 8u, j = (k % 8u) / 2u, l0 = 16u * (k % 2u);
    for (uint i = 0u; i < 16u; i += 4u) {
      const uint wv = (w_word(wo + 16u + 32u * h + l0 + i) >> (2u * j)) & 0x03030303u;
      for (uint t = 0u; t < TOKENS; ++t) acc[t] += dot4(wv, a_tok4(t, ab + 4u + 16u * k + i));
    }
    for (uint t = 0u; t < TOKENS; ++t) s[t].x += int(sc & 15u) * acc[t];
  }
}

float block_term(uint wo, uint ao, ivec2 s) {
  return min_term(a_f32(ao), half_to_float(w_u16(wo + 80u)), half_to_float(w_u16(wo + 82u)), s.x, s.y);
}

#include "linear_main.glsl"
