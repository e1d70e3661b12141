#version 450
#extension GL_GOOGLE_include_directive : require
// Q6_K weights x Q8_K activations (kernels/kquant_types.cpp dot_q6_k_scalar). A unit is two of
// the 16-element sub-blocks.
// Q6_K: ql[128] @0, qh[64] @128, scales int8[16] @192, d fp16 @208 (210 bytes).
#define BLOCK_COLS 256u
#define W_BLOCK 210u
#define A_BLOCK 292u
#define UNITS 8
#include "linear_common.glsl"

int w_sbyte_at(uint off) { return bitfieldExtract(int(w_byte(off)), 0, 8); }

void unit_sums(uint wo, uint ab, uint u, inout ivec2 s[TOKENS]) {
  for (uint k = 2u * u; k < 2u * u + 2u; ++k) {
    int acc[TOKENS];
    for (uint t = 0u; t < TOKENS; ++t) acc[t] = 0;
    for (uint e = 16u * k; e < 16u * k + 16u; ++e) {
      const uint h = e / 128u, rr = e % 128u, kk = rr / 32u, l = rr % 32u;
      const uint ql = w_byte(wo + 64u * h + ((kk & 1u) != 0u ? 32u + l : l));
      const uint low4 = (ql >> (kk >= 2u ? 4u : 0u)) & 15u;
      const uint high2 = (w_byte(wo + 128u + 32u * h + l) >> (2u * kk)) & 3u;
      const int wv = int(low4 | (high2 << 4)) - 32;
      for (uint t = 0u; t < TOKENS; ++t) acc[t] += a_tok(t, ab + 4u + e) * wv;
    }
    const int sc = w_sbyte_at(wo + 192u + k);
    for (uint t = 0u; t < TOKENS; ++t) s[t].x += sc * acc[t];
  }
}

float block_term(uint wo, uint ao, ivec2 s) { return scaled_term(half_to_float(w_u16(wo + 208u)), a_f32(ao), s.x); }

#include "linear_main.glsl"
