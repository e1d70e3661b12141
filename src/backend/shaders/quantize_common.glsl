// Shared by the activation quantizers (quantize_q8_0.comp, quantize_q8_k.comp): the CPU's
// quantizers (kernels/iquant_types.cpp quantize_row_q8_0, kernels/kquant_types.cpp
// quantize_block_q8_k) on the device, code for code, so a linear whose input the device quantized
// has the bits of one the host quantized. Vulkan rounds f32 and f64 add, subtract and multiply
// correctly, `precise` keeps them unfused and in order; it allows division 2.5 ulp of error, so the
// quantizers' divisions are made exact here (div_rn). Same assumption as the linear shaders
// (docs/numerics.md 1b): no block's largest value is below ~1e-30, where a scale would be an f32
// denormal.
//
// Bindings: 1 the f32 rows (p.in_stride floats apart), 2 the quantized rows (p.out_stride bytes
// apart, a multiple of 4, so no two invocations share an output word).
layout(std430, set = 0, binding = 1) readonly buffer In { float x[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Quant { uint q[]; };

layout(push_constant) uniform Push {
  uint units;       // invocations per row (blocks, or pairs of blocks for Q8_0)
  uint cols;        // floats per row
  uint n;           // rows
  uint unused0;
  uint in_stride;   // floats from one input row to the next
  uint out_stride;  // bytes from one quantized row to the next
  uint unused1, unused2, unused3;
} p;

// RN(a / b), the correctly rounded quotient the CPU's division gives, for finite b != 0 and a
// finite quotient: a candidate from the device's division (within a few ulp), then the nearest
// of its neighbours by the exact remainder a - c * b (c * b has 48 significant bits and the
// difference at most 50: both exact in double), ties to the even significand.
float div_rn(float a, float b) {
  if (a == 0.0) return a / b;
  const double da = double(a), db = double(b);
  const float q0 = float(da / db);
  if (isinf(q0)) return q0;
  float best = q0;
  precise double br = abs(da - double(q0) * db);
  for (int k = -3; k <= 3; ++k) {
    if (k == 0) continue;
    const float c = uintBitsToFloat(uint(int(floatBitsToUint(q0)) + k));
    if (isinf(c) || isnan(c) || sign(c) != sign(q0)) continue;
    precise double r = abs(da - double(c) * db);
    if (r < br || (r == br && (floatBitsToUint(c) & 1u) == 0u)) {
      best = c;
      br = r;
    }
  }
  return best;
}

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

float in_at(uint t, uint i) { return x[t * p.in_stride + i]; }
