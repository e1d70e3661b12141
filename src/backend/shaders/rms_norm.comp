#version 450
#extension GL_GOOGLE_include_directive : require
// RMSNorm in place (kernels/numerics.cpp rms_factor, rms_norm; docs/numerics.md 4), the CPU's bits:
// ss the sequential f32 sum of x * x (one invocation, in element order, each step rounded), mean =
// ss / n, r = 1 / sqrt(mean + eps) with the division and root correctly rounded (exact_div.glsl),
// then y = bf16((x * r) * w) per element. One workgroup per row.
#include "bf16.glsl"
#include "exact_div.glsl"
layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) readonly buffer Norm { float nw[]; };  // the norm's weights
layout(std430, set = 0, binding = 2) buffer Rows { float x[]; };          // the rows, normalized in place

layout(push_constant) uniform Push {
  uint n;       // rows
  uint width;   // floats normalized per row
  uint x_off;   // the first row's first float
  uint stride;  // floats from one row to the next
  uint eps;     // f32 bits
  uint unused0, unused1, unused2, unused3, unused4, unused5;
} p;

shared float factor;

void main() {
  const uint row = gl_WorkGroupID.x;
  if (row >= p.n) return;
  const uint base = p.x_off + row * p.stride;
  if (gl_LocalInvocationID.x == 0u) {
    float ss = 0.0;
    for (uint i = 0u; i < p.width; ++i) {
      precise float sq = x[base + i] * x[base + i];
      precise float acc = ss + sq;
      ss = acc;
    }
    const float mean = div_rn(ss, float(p.width));
    precise float t = mean + uintBitsToFloat(p.eps);
    factor = div_rn(1.0, sqrt_rn(t));
  }
  barrier();
  const float r = factor;
  for (uint i = gl_LocalInvocationID.x; i < p.width; i += 64u) {
    precise float a = x[base + i] * r;
    precise float b = a * nw[i];
    x[base + i] = round_bf16(b);
  }
}
