#version 450
#extension GL_GOOGLE_include_directive : require
// exp_f32 alone on an array in place (the op tests: gpu_exp), to hold exp_f32.glsl to the CPU's
// exp_f32 bit for bit on millions of arguments, which the ops that use it round away (BF16).
#define EXP_BINDING 0
#include "exp_f32.glsl"
layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 2) buffer Values { float x[]; };

layout(push_constant) uniform Push {
  uint n;  // values
  uint unused0, unused1, unused2, unused3, unused4, unused5, unused6, unused7, unused8, unused9;
} p;

void main() {
  const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
  if (i < p.n) x[i] = exp_f32(x[i]);
}
