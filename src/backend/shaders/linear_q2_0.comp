#version 450
#extension GL_GOOGLE_include_directive : require
// Q2_0 weights x Q8_0 activations (kernels/iquant_types.cpp dot_q2_0_scalar): a 64-element Q2_0
// block (d fp16 @0, 2-bit codes @2, value (code - 1) * d; 18 bytes) spans two Q8_0 blocks, whose
// scaled integer sums are accumulated from +0 (k = 0 then 1) before the weight scale is applied.
// A unit is one of the two Q8_0 blocks (its sum in .x for k = 0, .y for k = 1).
#define BLOCK_COLS 64u
#define W_BLOCK 18u
#define A_BLOCK 68u
#define UNITS 2
#include "linear_common.glsl"

void unit_sums(uint wo, uint ab, uint k, inout ivec2 s[TOKENS]) {
  int acc[TOKENS];
  for (uint t = 0u; t < TOKENS; ++t) acc[t] = 0;
  // Code c = 32k + j is bits 2(c % 4) of byte c / 4: a byte holds four codes, spread here one
  // to a byte of the word, value code - 1.
  for (uint j = 0u; j < 32u; j += 4u) {
    const uint b = w_byte(wo + 2u + 8u * k + j / 4u);
    const uint codes = (b & 3u) | ((b << 6) & 0x300u) | ((b << 12) & 0x30000u) | ((b << 18) & 0x3000000u);
    const uint wv = sub_bytes(codes, 0x01010101u);
    for (uint t = 0u; t < TOKENS; ++t) acc[t] += dot4(wv, a_tok4(t, ab + 34u * k + 2u + j));
  }
  for (uint t = 0u; t < TOKENS; ++t) s[t] += k == 0u ? ivec2(acc[t], 0) : ivec2(0, acc[t]);
}

float block_term(uint wo, uint ao, ivec2 s) {
  precise float acc = 0.0;
  precise float t0 = half_to_float(a_u16(ao)) * float(s.x);
  acc = acc + t0;
  precise float t1 = half_to_float(a_u16(ao + 34u)) * float(s.y);
  acc = acc + t1;
  precise float term = half_to_float(w_u16(wo)) * acc;
  return term;
}

#include "linear_main.glsl"
