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
    // Element e = 16k + i (h = e / 128, kk = e % 128 / 32, l = e % 32): a nibble of ql's byte
    // 64h + 32(kk & 1) + l (high for kk >= 2), bits 2kk of qh's byte 32h + l above it, less 32.
    const uint h = k / 8u, kk = (k % 8u) / 2u, l0 = 16u * (k % 2u);
    for (uint i = 0u; i < 16u; i += 4u) {
      const uint low = (w_word(wo + 64u * h + 32u * (kk & 1u) + l0 + i) >> (kk >= 2u ? 4u : 0u)) & 0x0f0f0f0fu;
      const uint high = (w_word(wo + 128u + 32u * h + l0 + i) >> (2u * kk)) & 0x03030303u;
      const uint wv = sub_bytes(low | (high << 4), 0x20202020u);
      for (uint t = 0u; t < TOKENS; ++t) acc[t] += dot4(wv, a_tok4(t, ab + 4u + 16u * k + i));
    }
    const int sc = w_sbyte_at(wo + 192u + k);
    for (uint t = 0u; t < TOKENS; ++t) s[t].x += sc * acc[t];
  }
}

float block_term(uint wo, uint ao, ivec2 s) { return scaled_term(half_to_float(w_u16(wo + 208u)), a_f32(ao), s.x); }

#include "linear_main.glsl"
