#version 450
#extension GL_GOOGLE_include_directive : require
// Q8_0 weights x Q8_0 activations (quantized on the host by the CPU's quantizer): per block the
// exact integer sum, then step_q8_0's float operations (kernels/iquant_types.h) in block order:
// sumf + float(sumi) * (dx * dy). Vulkan rounds f32 add and mul correctly, `precise` forbids
// fusing or reordering them, and no operand or result can be an f32 denormal (fp16 scales are at
// least 2^-24, so dx * dy >= 2^-48), so the result has the CPU's bits on every conformant device.
#include "linear_common.glsl"

void main() {
  const uint r = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (r >= p.rows || t >= p.n) return;
  uint wo = p.w_off + (p.row0 + r) * p.w_row_bytes, ao = t * p.a_stride;
  float sumf = 0.0;
  for (uint b = 0u; b < p.cols / 32u; ++b, wo += 34u, ao += 34u) {
    int sumi = 0;
    for (uint j = 2u; j < 34u; ++j) sumi += w_sbyte(wo + j) * a_sbyte(ao + j);
    sumf = scaled_step(sumf, half_to_float(w_u16(wo)), half_to_float(a_u16(ao)), sumi);
  }
  store_out(r, t, sumf);
}
