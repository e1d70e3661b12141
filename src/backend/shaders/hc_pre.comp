#version 450
#extension GL_GOOGLE_include_directive : require
// hc_pre (kernels/numerics.cpp; spec 3.2), the CPU's bits: the hc streams of a token collapsed
// with its pre weights, y[k] = bf16(w[0] * X[0][k] + ... + w[hc-1] * X[hc-1][k]), from 0, each
// product and sum rounded in stream order. An invocation per element, a token per y.
#include "bf16.glsl"
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint n;                // tokens
  uint width;            // floats of one stream (the hidden size)
  uint hc;               // streams
  uint x_at, x_stride;   // token t's stream h at x_at + t * x_stride + h * width (rows_io.glsl)
  uint w_at, w_stride;   // token t's pre weights at w_at + t * w_stride
  uint y_off, y_stride;  // token t's output at y_off + t * y_stride of the output buffer
  uint unused0, unused1;
  uint base_staged, base_in, base_out;  // rows_io.glsl: where its bindings start
} p;
#include "rows_io.glsl"

void main() {
  const uint k = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
  if (k >= p.width || t >= p.n) return;
  precise float acc = 0.0;
  for (uint h = 0u; h < p.hc; ++h) {
    precise float prod = rd(p.w_at + t * p.w_stride + h) * rd(p.x_at + t * p.x_stride + h * p.width + k);
    acc = acc + prod;
  }
  OUT(p.y_off + t * p.y_stride + k) = round_bf16(acc);
}
