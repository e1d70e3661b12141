#version 450
#extension GL_GOOGLE_include_directive : require
// hc_post (kernels/numerics.cpp; spec 3.2), the CPU's bits: a sublayer's output F written back into
// the hc streams, Y[j][k] = bf16(post[j] * F[k] + comb[0][j] * X[0][k] + ... + comb[hc-1][j] *
// X[hc-1][k]), each product and sum rounded in stream order; the mixes row of a token is [pre: hc]
// [post: hc][comb: hc x hc]. An invocation per element of F, writing its hc outputs; a token per y.
#include "bf16.glsl"
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint n;                // tokens
  uint width;            // floats of F and of one stream
  uint hc;               // streams
  uint f_at, f_stride;   // token t's F at f_at + t * f_stride (rows_io.glsl)
  uint x_at, x_stride;   // token t's stream i at x_at + t * x_stride + i * width
  uint m_at, m_stride;   // token t's mixes at m_at + t * m_stride
  uint y_off, y_stride;  // token t's stream j out at y_off + t * y_stride + j * width (output buffer)
  uint base_staged, base_in, base_out;  // rows_io.glsl: where its bindings start
} p;
#include "rows_io.glsl"

void main() {
  const uint k = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
  if (k >= p.width || t >= p.n) return;
  const uint m = p.m_at + t * p.m_stride, x = p.x_at + t * p.x_stride + k;
  const float f = rd(p.f_at + t * p.f_stride + k);
  for (uint j = 0u; j < p.hc; ++j) {
    precise float acc = rd(m + p.hc + j) * f;
    for (uint i = 0u; i < p.hc; ++i) {
      precise float prod = rd(m + 2u * p.hc + i * p.hc + j) * rd(x + i * p.width);
      acc = acc + prod;
    }
    OUT(p.y_off + t * p.y_stride + j * p.width + k) = round_bf16(acc);
  }
}
