// Shared by the activation quantizers (quantize_q8_0.comp, quantize_q8_k.comp): the CPU's
// quantizers (kernels/iquant_types.cpp quantize_row_q8_0, kernels/kquant_types.cpp
// quantize_block_q8_k) on the device, code for code, so a linear whose input the device quantized
// has the bits of one the host quantized. Vulkan rounds f32 and f64 add, subtract and multiply
// correctly, `precise` keeps them unfused and in order; it allows division 2.5 ulp of error, so the
// quantizers' divisions are made exact (exact_div.glsl). Same assumption as the linear shaders
// (docs/numerics.md 1b): no block's largest value is below ~1e-30, where a scale would be an f32
// denormal.
//
// Bindings: 1 the f32 rows (from p.in_off, p.in_stride floats apart: rows staged by the host, or
// a linear's outputs earlier in the same submission), 2 the quantized rows (p.out_stride bytes
// apart, a multiple of 4, so no two invocations share an output word).
layout(std430, set = 0, binding = 1) readonly buffer In { float x[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Quant { uint q[]; };

layout(push_constant) uniform Push {
  uint units;       // invocations per row (blocks, or pairs of blocks for Q8_0)
  uint cols;        // floats per row
  uint n;           // rows
  uint in_off;      // the first row's first float in the binding
  uint in_stride;   // floats from one input row to the next
  uint out_stride;  // bytes from one quantized row to the next
  uint unused1, unused2, unused3, unused4, unused5;
} p;

#include "exact_div.glsl"

// kernels/fp.h f32_to_f16 (round to nearest even), on the bits; the subnormal range in integers,
// so a device that flushes f32 denormals still converts right.
uint f32_to_f16(float f) {
  const uint xb = floatBitsToUint(f), s = (xb >> 16) & 0x8000u, ax = xb & 0x7fffffffu;
  if (ax > 0x7f800000u) return s | 0x7e00u;
  if (ax >= 0x477ff000u) return s | 0x7c00u;
  if (ax < 0x38800000u) {
    const uint e = ax >> 23;
    if (e < 102u) return s;  // below 2^-25: rounds to zero
    const uint m = (ax & 0x7fffffu) | 0x800000u, sh = 126u - e;  // value * 2^24 = m / 2^sh
    uint r = m >> sh;
    const uint rem = m & ((1u << sh) - 1u), mid = 1u << (sh - 1u);
    if (rem > mid || (rem == mid && (r & 1u) != 0u)) ++r;
    return s | r;
  }
  return s | ((ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13);
}

float in_at(uint t, uint i) { return x[p.in_off + t * p.in_stride + i]; }
