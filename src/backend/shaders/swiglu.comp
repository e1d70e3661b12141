#version 450
#extension GL_GOOGLE_include_directive : require
// The experts' clamped SwiGLU (backend/swiglu.h, docs/numerics.md 7) in place, the CPU's bits:
// h = bf16((silu(min(g, lim)) * clamp(u, -lim, lim)) * wk), silu(g) = g / (1 + exp_f32(-g)) with
// exp_f32 restated (exp_f32.glsl) and the division correctly rounded (exact_div.glsl). g and u are
// columns of the same rows (a region of the output buffer the gate and up projections wrote); h
// replaces g. wk is 1, or per row from binding 1. An invocation per element, a row per y.
#include "bf16.glsl"
#include "exact_div.glsl"
#define EXP_BINDING 0
#include "exp_f32.glsl"
layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 1) readonly buffer Weights { float wk[]; };  // per row (p.row_weights)
layout(std430, set = 0, binding = 2) buffer Rows { float x[]; };

layout(push_constant) uniform Push {
  uint n;            // rows
  uint width;        // elements of g (and of u) per row
  uint g_off;        // g's first float in the first row
  uint stride;       // floats from one row to the next
  uint limit;        // f32 bits
  uint u_off;        // u's first float in the first row
  uint row_weights;  // 1: wk[row], else 1
  uint unused0, unused1, unused2, unused3;
} p;

void main() {
  const uint i = gl_GlobalInvocationID.x, row = gl_WorkGroupID.y;
  if (i >= p.width || row >= p.n) return;
  const float lim = uintBitsToFloat(p.limit);
  float g = x[p.g_off + row * p.stride + i];
  float u = x[p.u_off + row * p.stride + i];
  g = lim < g ? lim : g;                             // std::min(g, lim)
  u = u < -lim ? -lim : (lim < u ? lim : u);         // std::clamp(u, -lim, lim)
  const float e = exp_f32(-g);
  precise float d = 1.0 + e;
  // g / d: d >= 1; an infinite d (g below -89) gives g's signed zero, as IEEE division does.
  const float s = isinf(d) ? (g < 0.0 ? -0.0 : 0.0) : div_rn(g, d);
  const float w = p.row_weights != 0u ? wk[row] : 1.0;
  precise float a = s * u;
  precise float b = a * w;
  x[p.g_off + row * p.stride + i] = round_bf16(b);
}
