#version 450
#extension GL_GOOGLE_include_directive : require
// add_round (CpuBackend::add_round), the CPU's bits: y = bf16(a + b), the f32 sum correctly
// rounded. a and b are rows the host staged or the batch wrote (rows_io.glsl): the FFN's output,
// the routed experts' sums the CPU made plus the shared expert the device made. An invocation per
// element, a row per y.
#include "bf16.glsl"
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint n;                // rows
  uint width;            // floats a row
  uint a_at, a_stride;   // row t of a at a_at + t * a_stride (rows_io.glsl)
  uint b_at, b_stride;
  uint y_off, y_stride;  // row t of y at y_off + t * y_stride of the output buffer
  uint unused0, unused1, unused2;
  uint base_staged, base_in, base_out;  // rows_io.glsl: where its bindings start
} p;
#include "rows_io.glsl"

void main() {
  const uint k = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
  if (k >= p.width || t >= p.n) return;
  precise float s = rd(p.a_at + t * p.a_stride + k) + rd(p.b_at + t * p.b_stride + k);
  OUT(p.y_off + t * p.y_stride + k) = round_bf16(s);
}
