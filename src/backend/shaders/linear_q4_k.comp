#version 450
#extension GL_GOOGLE_include_directive : require
// Q4_K weights x Q8_K activations (kernels/kquant_types.cpp dot_q4_k_scalar). A unit is one of
// the eight 32-element sub-blocks with its min over two bsums.
// Q4_K: d fp16 @0, dmin fp16 @2, scales[12] @4 (8 scales + 8 mins, 6 bits), qs[128] @16 (144 bytes).
#define BLOCK_COLS 256u
#define W_BLOCK 144u
#define A_BLOCK 292u
#define UNITS 8
#include "linear_common.glsl"
#include "kquant_tail.glsl"

// kquant_blocks.h unpack_q4k_scales: scale (or min, with m = 1) k of the 12 packed bytes at off.
uint q4k_scale(uint off, uint k, uint m) {
  if (k < 4u) return w_byte(off + k + 4u * m) & 63u;
  return m == 0u ? ((w_byte(off + k + 4u) & 15u) | ((w_byte(off + k - 4u) >> 6) << 4))
                 : ((w_byte(off + k + 4u) >> 4) | ((w_byte(off + k) >> 6) << 4));
}

void unit_sums(uint wo, uint ab, uint k, inout ivec2 s[TOKENS]) {
  const int mn = int(q4k_scale(wo + 4u, k, 1u)), sc = int(q4k_scale(wo + 4u, k, 0u));
  int acc[TOKENS];
  for (uint t = 0u; t < TOKENS; ++t) {
    for (uint j = 2u * k; j < 2u * k + 2u; ++j) s[t].y += a16_tok(t, ab + 260u + 2u * j) * mn;
    acc[t] = 0;
  }
  // Element e = 32k + l is the low (k even) or high nibble of byte l of qs's 32 bytes k / 2.
  for (uint l = 0u; l < 32u; l += 4u) {
    const uint wv = (w_word(wo + 16u + 32u * (k / 2u) + l) >> (4u * (k % 2u))) & 0x0f0f0f0fu;
    for (uint t = 0u; t < TOKENS; ++t) acc[t] += dot4(wv, a_tok4(t, ab + 4u + 32u * k + l));
  }
  for (uint t = 0u; t < TOKENS; ++t) s[t].x += sc * acc[t];
}

float block_term(uint wo, uint ao, ivec2 s) {
  return min_term(a_f32(ao), half_to_float(w_u16(wo)), half_to_float(w_u16(wo + 2u)), s.x, s.y);
}

#include "linear_main.glsl"
