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
#include "fp_grids.glsl"
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
