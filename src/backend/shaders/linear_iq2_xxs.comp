#version 450
#extension GL_GOOGLE_include_directive : require
// IQ2_XXS weights x Q8_K activations (kernels/iquant_types.cpp dot_iq2_xxs_scalar).
// IQ2_XXS: d fp16 @0, then per 32-element sub-block two u32 words: w0 = four 8-bit grid indices,
// w1 = four 7-bit sign indices and a 4-bit scale s in the top bits (66 bytes per 256). A unit is
// one sub-block.
#define BLOCK_COLS 256u
#define W_BLOCK 66u
#define A_BLOCK 292u
#define UNITS 8
#include "linear_common.glsl"
#include "iq2_common.glsl"

#define FINISH(v) iq2_finish(v)

void unit_sums(uint wo, uint ab, uint ib, inout ivec2 s[TOKENS]) {
  const uint w0 = w_u32(wo + 2u + 8u * ib), w1 = w_u32(wo + 6u + 8u * ib);
  int sumi[TOKENS];
  for (uint t = 0u; t < TOKENS; ++t) sumi[t] = 0;
  for (uint l = 0u; l < 4u; ++l)
    group_dot(0u, (w0 >> (8u * l)) & 255u, (w1 >> (7u * l)) & 127u, ab + 4u + 32u * ib + 8u * l, sumi);
  const int sc = int(2u * (w1 >> 28) + 1u);
  for (uint t = 0u; t < TOKENS; ++t) s[t].x += sumi[t] * sc;
}

float block_term(uint wo, uint ao, ivec2 s) { return scaled_term(half_to_float(w_u16(wo)), a_f32(ao), s.x); }  // step_iq2

#include "linear_main.glsl"
