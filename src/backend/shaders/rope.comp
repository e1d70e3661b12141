#version 450
#extension GL_GOOGLE_include_directive : require
// RoPE in place on rows a deferred batch holds (kernels/numerics.cpp rope_apply; numerics.md 4),
// the CPU's bits: on the last 2 * half values of every head, pair j of token t turns by the angle
// whose cos and sin the host computed (rope_angles: double cos and sin rounded to float, staged
// per token as half cos then half sin); re' = bf16(re c - im s), im' = bf16(re s + im c), each
// product and difference rounded, s negated for the inverse. An invocation per pair and head, a
// token per y.
#include "bf16.glsl"
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint n;         // tokens
  uint half_;     // rotated pairs per head
  uint head_dim;  // floats per head
  uint heads;
  uint x_off, x_stride;  // token t's first head at x_off + t * x_stride of the output buffer
  uint tab_at;    // token t's cos at tab_at + t * 2 * half, its sin half after (rows_io.glsl)
  uint inverse;   // 1: turn back
  uint unused0, unused1, unused2;
  uint base_staged, base_in, base_out;  // rows_io.glsl: where its bindings start
} p;
#include "rows_io.glsl"

void main() {
  const uint j = gl_GlobalInvocationID.x % p.half_, h = gl_GlobalInvocationID.x / p.half_, t = gl_WorkGroupID.y;
  if (h >= p.heads || t >= p.n) return;
  const float c = rd(p.tab_at + t * 2u * p.half_ + j);
  const float s0 = rd(p.tab_at + t * 2u * p.half_ + p.half_ + j);
  const float s = p.inverse != 0u ? -s0 : s0;
  const uint at = p.x_off + t * p.x_stride + h * p.head_dim + (p.head_dim - 2u * p.half_) + 2u * j;
  const float re = OUT(at), im = OUT(at + 1u);
  precise float a = re * c;
  precise float b = im * s;
  precise float r0 = a - b;
  precise float e = re * s;
  precise float f = im * c;
  precise float r1 = e + f;
  OUT(at) = round_bf16(r0);
  OUT(at + 1u) = round_bf16(r1);
}
