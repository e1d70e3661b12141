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
    // Element e = 16k + i: low bits 2j of byte l of qs's half h, high bit 4h + j of hmask's
    // byte l (h = e / 128, j = e % 128 / 32, l = e % 32), value (low | high << 2) - 4.
    const uint h = k / 8u, j = (k % 8u) / 2u, l0 = 16u * (k % 2u);
    for (uint i = 0u; i < 16u; i += 4u) {
      const uint low = (w_word(wo + 32u + 32u * h + l0 + i) >> (2u * j)) & 0x03030303u;
      const uint high = (w_word(wo + l0 + i) >> (4u * h + j)) & 0x01010101u;
      const uint wv = sub_bytes(low | (high << 2), 0x04040404u);
      for (uint t = 0u; t < TOKENS; ++t) acc[t] += dot4(wv, a_tok4(t, ab + 4u + 16u * k + i));
    }
    for (uint t = 0u; t < TOKENS; ++t) s[t].x += sc * acc[t];
  }
}

float block_term(uint wo, uint ao, ivec2 s) { return scaled_term(half_to_float(w_u16(wo + 108u)), a_f32(ao), s.x); }

#include "linear_main.glsl"
