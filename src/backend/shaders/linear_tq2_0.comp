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
  // Element e = 32u + l is bits 2(u % 4) of byte l of the codes' 32 bytes u / 4, value code - 1.
  for (uint l = 0u; l < 32u; l += 4u) {
    const uint codes = (w_word(wo + 32u * (u / 4u) + l) >> (2u * (u % 4u))) & 0x03030303u;
    const uint wv = sub_bytes(codes, 0x01010101u);
    for (uint t = 0u; t < TOKENS; ++t) s[t].x += dot4(wv, a_tok4(t, ab + 4u + 32u * u + l));
  }
}

float block_term(uint wo, uint ao, ivec2 s) { return scaled_term(half_to_float(w_u16(wo + 64u)), a_f32(ao), s.x); }  // step_tq2_0

#include "linear_main.glsl"
