#version 450
#extension GL_GOOGLE_include_directive : require
// The routed experts' sums (CpuBackend::routed_ffn), the CPU's bits: y[t] = s[t] + term_j1 +
// term_j2 + ... over the triples of token t in triple order, each sum rounded in f32, from the
// sums as they were (rows_io.glsl: staged or written by the batch). The terms are rows the
// batch's down projections wrote, listed per token by their places. An invocation per element, a
// token per y.
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint n;                // tokens
  uint width;            // floats a row
  uint s_at, s_stride;   // token t's sums at s_at + t * s_stride (rows_io.glsl)
  uint l_at;             // word index of the lists: per token (first, count), then the terms' places
  uint y_off, y_stride;  // token t's output at y_off + t * y_stride of the output buffer
  uint unused0, unused1, unused2, unused3;
  uint base_staged, base_in, base_out;  // rows_io.glsl: where its bindings start
} p;
#include "rows_io.glsl"

void main() {
  const uint k = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
  if (k >= p.width || t >= p.n) return;
  precise float acc = rd(p.s_at + t * p.s_stride + k);
  const uint first = SU(p.l_at + 2u * t), count = SU(p.l_at + 2u * t + 1u);
  for (uint j = 0u; j < count; ++j) acc = acc + rd(SU(p.l_at + first + j) + k);
  OUT(p.y_off + t * p.y_stride + k) = acc;
}
