#version 450
#extension GL_GOOGLE_include_directive : require
// IQ2_XS weights x Q8_K activations (kernels/iquant_types.cpp dot_iq2_xs_scalar).
// IQ2_XS: d fp16 @0, qs u16[32] @2 (9-bit grid index, 7-bit sign index), scales u8[8] @66
// (two 4-bit scales per 32-element sub-block: groups {0,1} low nibble, {2,3} high), 74 bytes.
// A unit is one sub-block.
#include "linear_common.glsl"
#include "iq2_common.glsl"

#define BLOCK_COLS 256u
#define W_BLOCK 74u
#define A_BLOCK 292u
#define UNITS 8
#define FINISH(v) iq2_finish(v)

ivec2 unit_sums(uint wo, uint ao, uint ib) {
  const uint sc = w_byte(wo + 66u + ib);
  int half_sum[2] = int[2](0, 0);
  for (uint l = 0u; l < 4u; ++l) {
    const uint q = w_u16(wo + 2u + 2u * (4u * ib + l));
    half_sum[l / 2u] += group_dot(512u, q & 511u, q >> 9, ao + 4u + 32u * ib + 8u * l);
  }
  return ivec2(half_sum[0] * int(2u * (sc & 15u) + 1u) + half_sum[1] * int(2u * (sc >> 4) + 1u), 0);
}

float block_term(uint wo, uint ao, ivec2 s) { return scaled_term(half_to_float(w_u16(wo)), a_f32(ao), s.x); }  // step_iq2

#include "linear_main.glsl"
