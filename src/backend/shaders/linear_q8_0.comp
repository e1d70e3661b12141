#version 450
#extension GL_GOOGLE_include_directive : require
// Q8_0 weights x Q8_0 activations: per block the exact integer sum, then step_q8_0's float
// operations (kernels/iquant_types.h) in block order: sumf + float(sumi) * (dx * dy). Vulkan
// rounds f32 add and mul correctly, `precise` forbids fusing or reordering them, and no operand
// or result can be an f32 denormal (fp16 scales are at least 2^-24, so dx * dy >= 2^-48), so the
// result has the CPU's bits on every conformant device.
#define BLOCK_COLS 32u
#define W_BLOCK 34u
#define A_BLOCK 34u
#define UNITS 1
#include "linear_common.glsl"

void unit_sums(uint wo, uint ab, uint u, inout ivec2 s[TOKENS]) {
  for (uint j = 2u; j < 34u; j += 4u) {
    const uint wv = w_word(wo + j);
    for (uint t = 0u; t < TOKENS; ++t) s[t].x += dot4(wv, a_tok4(t, ab + j));
  }
}

float block_term(uint wo, uint ao, ivec2 s) { return scaled_term(half_to_float(w_u16(wo)), half_to_float(a_u16(ao)), s.x); }

#include "linear_main.glsl"
