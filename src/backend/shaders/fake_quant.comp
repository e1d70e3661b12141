#version 450
#extension GL_GOOGLE_include_directive : require
// The fake-quant grids in place on rows a deferred batch holds (kernels/numerics.cpp
// fake_quant_fp8_window, fake_quant_nvfp4, fake_quant_mxfp4; numerics.md 5), the CPU's bits: per
// block, amax = the running max of |v| (NaNs skipped, as std::max does), the scale (a power of two
// for FP8 and MXFP4, an E4M3 value for NVFP4), then each value divided by it (correctly rounded),
// put on its grid (E4M3 with ties to even, saturating; E2M1 by the CPU's thresholds), multiplied
// back and rounded to BF16. frexp and ldexp are done on the bits. An invocation per block, a row
// per y.
#include "bf16.glsl"
#include "exact_div.glsl"
layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 2) buffer Rows { float x[]; };

layout(push_constant) uniform Push {
  uint n;         // rows
  uint width;     // floats per row (whole blocks)
  uint x_off;     // the first row's first float
  uint stride;    // floats from one row to the next
  uint kind;      // 0: FP8 window (blocks of 32), 1: NVFP4 (16), 2: MXFP4 (32)
  uint unused0, unused1, unused2, unused3, unused4, unused5;
} p;

// std::frexp's exponent of a finite a > 0: a = f * 2^e, f in [0.5, 1).
int frexp_exp(float a) {
  const uint b = floatBitsToUint(a), e = (b >> 23) & 0xffu;
  if (e != 0u) return int(e) - 126;
  return findMSB(b & 0x7fffffu) - 148;  // subnormal: the leading bit sets the binade
}
// 2^k for a normal result.
float pow2(int k) { return uintBitsToFloat(uint(k + 127) << 23); }

// kernels/numerics.cpp pow2_ceil: 2^ceil(log2(a)) for a normal a > 0.
float pow2_ceil(float a) {
  const uint b = floatBitsToUint(a);
  return (b & 0x7fffffu) == 0u ? a : uintBitsToFloat(((b >> 23) + 1u) << 23);
}

// kernels/numerics.cpp e4m3_rne.
float e4m3_rne(float v) {
  if (isnan(v)) return v;
  const float a = abs(v);
  float q;
  if (a >= 448.0) {
    q = 448.0;
  } else if (a == 0.0) {
    q = 0.0;
  } else {
    const int e = max(frexp_exp(a) - 1, -6);
    // a / 2^(e-3) and back are exact (powers of two, normal results); roundEven is nearbyint's ties-to-even.
    precise float scaled = a * pow2(3 - e);
    precise float r = roundEven(scaled) * pow2(e - 3);
    q = r > 448.0 ? 448.0 : r;
  }
  return (floatBitsToUint(v) & 0x80000000u) != 0u ? -q : q;
}

// kernels/numerics.cpp e2m1_rne (e2m1_code's thresholds, midpoints to the even code).
float e2m1_rne(float v) {
  if (isnan(v)) return v;
  const float a = abs(v);
  float q;
  if (a <= 0.25) q = 0.0;
  else if (a < 0.75) q = 0.5;
  else if (a <= 1.25) q = 1.0;
  else if (a < 1.75) q = 1.5;
  else if (a <= 2.5) q = 2.0;
  else if (a < 3.5) q = 3.0;
  else if (a <= 5.0) q = 4.0;
  else q = 6.0;
  return (floatBitsToUint(v) & 0x80000000u) != 0u ? -q : q;
}

void main() {
  const uint bsize = p.kind == 1u ? 16u : 32u;
  const uint b = gl_GlobalInvocationID.x, row = gl_WorkGroupID.y;
  if (b * bsize >= p.width || row >= p.n) return;
  const uint base = p.x_off + row * p.stride + b * bsize;
  float amax = 0.0;
  for (uint i = 0u; i < bsize; ++i) {
    const float a = abs(x[base + i]);
    amax = amax < a ? a : amax;  // std::max(amax, |v|)
  }
  float s;
  if (p.kind == 0u) {
    const float lo = uintBitsToFloat(0x38d1b717u);  // 1e-4f
    s = pow2_ceil(div_rn(amax < lo ? lo : amax, 448.0));
  } else if (p.kind == 1u) {
    const float lo = uintBitsToFloat(0x3c400000u);  // 6 / 512
    s = e4m3_rne(div_rn(amax < lo ? lo : amax, 6.0));
  } else {
    const float lo = uintBitsToFloat(0x01c00000u);  // 6 * 2^-126
    s = pow2_ceil(div_rn(amax < lo ? lo : amax, 6.0));
  }
  for (uint i = 0u; i < bsize; ++i) {
    const float v = x[base + i];
    const float d = div_rn(v, s);
    float q;
    if (p.kind == 0u) {
      const float c = d < -448.0 ? -448.0 : (448.0 < d ? 448.0 : d);  // std::clamp
      q = e4m3_rne(c);
    } else {
      q = e2m1_rne(d);
    }
    precise float y = q * s;
    x[base + i] = round_bf16(y);
  }
}
