#version 450
#extension GL_GOOGLE_include_directive : require
// TQ2_0 weights x Q8_K activations (kernels/iquant_types.cpp dot_tq2_0_scalar): element e has
// code (qs[32 * (e / 128) + e % 32] >> 2 * ((e % 128) / 32)) & 3, value (code - 1) * d.
// TQ2_0: qs u8[64] @0, d fp16 @64 (66 bytes per 256). A unit is 32 elements of the one sum.
#define BLOCK_COLS 256u
#define W_BLOCK 66u
#define A_BLOCK 292u
#define UNITS 8
#include "linear_common.glsl"

void unit_sums(uint wo, uint ab, uint u, inout ivec2 s[TOKENS]) {
  for (uint e = 32u * u; e < 32u * u + 32u; ++e) {
    const uint code = (w_byte(wo + 32u * (e / 128u) + e % 32u) >> (2u * ((e % 128u) / 32u))) & 3u;
    const int wv = int(code) - 1;
    for (uint t = 0u; t < TOKENS; ++t) s[t].x += wv * a_tok(t, ab + 4u + e);
  }
}

float block_term(uint wo, uint ao, ivec2 s) { return scaled_term(half_to_float(w_u16(wo + 64u)), a_f32(ao), s.x); }  // step_tq2_0

#include "linear_main.glsl"
