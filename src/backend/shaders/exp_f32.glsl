// exp_f32 (kernels/exp_f32.cpp, docs/numerics.md 4a), operation for operation: IEEE double add
// and multiply, which Vulkan rounds correctly, under `precise`, and the same constants, which the
// host uploads from exp_f32_constants() (binding EXP_BINDING: the table of 2^(j/64), 64/ln 2 and
// the polynomial's c1..c4), so the bits are the CPU's. Needs shaderFloat64.
#ifndef EXP_BINDING
#define EXP_BINDING 0
#endif
layout(std430, set = 0, binding = EXP_BINDING) readonly buffer ExpConstants { double ec[]; };

float exp_f32(float x) {
  if (!(x <= 89.0)) return isnan(x) ? x : uintBitsToFloat(0x7f800000u);
  if (x < -88.0) return 0.0;
  precise double z = double(x) * ec[64];
  const double kd = roundEven(z);
  precise double r = z - kd;
  const int k = int(kd);
  precise double p = 1.0LF + r * (ec[65] + r * (ec[66] + r * (ec[67] + r * ec[68])));
  const double scale = packDouble2x32(uvec2(0u, uint((k >> 6) + 1023) << 20u));  // 2^(k div 64)
  precise double y = (ec[k & 63] * p) * scale;
  if (y >= packDouble2x32(uvec2(0xf0000000u, 0x47efffffu))) return uintBitsToFloat(0x7f800000u);  // 2^128 - 2^103
  if (y < packDouble2x32(uvec2(0u, 0x38100000u))) return 0.0;                                     // 2^-126
  return float(y);
}
