#version 450
#extension GL_GOOGLE_include_directive : require
// IQ2_XS weights x Q8_K activations (kernels/iquant_types.cpp dot_iq2_xs_scalar).
// IQ2_XS: d fp16 @0, qs u16[32] @2 (9-bit grid index, 7-bit sign index), scales u8[8] @66
// (two 4-bit scales per 32-element sub-block: groups {0,1} low nibble, {2,3} high), 74 bytes.
// A unit is one sub-block.
#define BLOCK_COLS 256u
#define W_BLOCK 74u
#define A_BLOCK 292u
#define UNITS 8
#include "linear_common.glsl"
#include "iq2_common.glsl"

#define FINISH(v) iq2_finish(v)

void unit_sums(uint wo, uint ab, uint ib, inout ivec2 s[TOKENS]) {
  const uint sc = w_byte(wo + 66u + ib);
  int lo[TOKENS], hi[TOKENS];
  for (uint t = 0u; t < TOKENS; ++t) lo[t] = hi[t] = 0;
  for (uint l = 0u; l < 2u; ++l) {
    const uint q = w_u16(wo + 2u + 2u * (4u * ib + l));
    group_dot(512u, q & 511u, q >> 9, ab + 4u + 32u * ib + 8u * l, lo);
  }
  for (uint l = 2u; l < 4u; ++l) {
    const uint q = w_u16(wo + 2u + 2u * (4u * ib + l));
    group_dot(512u, q & 511u, q >> 9, ab + 4u + 32u * ib + 8u * l, hi);
  }
  const int s_lo = int(2u * (sc & 15u) + 1u), s_hi = int(2u * (sc >> 4) + 1u);
  for (uint t = 0u; t < TOKENS; ++t) s[t].x += lo[t] * s_lo + hi[t] * s_hi;
}

float block_term(uint wo, uint ao, ivec2 s) { return scaled_term(half_to_float(w_u16(wo)), a_f32(ao), s.x); }  // step_iq2

#include "linear_main.glsl"
