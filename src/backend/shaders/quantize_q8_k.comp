#version 450
#extension GL_GOOGLE_include_directive : require
// Q8_K activations (kernels/kquant_types.cpp quantize_block_q8_k, spec 3.3): per block of 256, the
// first value of the largest magnitude is max, iscale = -127 / max, codes min(127,
// nearest_int(iscale * x)) (ggml's nearest_int: ties to even by the 1.5 * 2^23 shift, non-finite
// products store 0), 16 sums of 16 codes, then d = 1 / iscale. Layout (kquant_blocks.h q8k):
// d f32 at 0, codes at 4, sums (int16) at 260; 292 bytes, whole words: one invocation per block.
#include "quantize_common.glsl"
layout(local_size_x = 64) in;

int nearest_int(float v) {
  precise float shifted = v + 12582912.0;
  return int(floatBitsToUint(shifted) & 0x007fffffu) - 0x00400000;
}

void main() {
  const uint b = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (b >= p.units || t >= p.n) return;
  const uint base = b * 256u, w0 = (t * p.out_stride + b * 292u) >> 2;
  float amax = 0.0, mx = 0.0;
  for (uint e = 0u; e < 256u; ++e) {
    const float v = in_at(t, base + e);
    if (abs(v) > amax) {
      amax = abs(v);
      mx = v;
    }
  }
  if (amax == 0.0) {
    for (uint i = 0u; i < 73u; ++i) q[w0 + i] = 0u;
    return;
  }
  const float iscale = div_rn(-127.0, mx);
  int sums[16];
  for (uint j = 0u; j < 16u; ++j) sums[j] = 0;
  for (uint w = 0u; w < 64u; ++w) {  // four codes a word
    uint word = 0u;
    for (uint k = 0u; k < 4u; ++k) {
      const uint e = 4u * w + k;
      precise float v = iscale * in_at(t, base + e);
      const int c = bitfieldExtract(min(127, nearest_int(v)), 0, 8);  // (int8_t) of the CPU
      sums[e / 16u] += c;
      word |= (uint(c) & 0xffu) << (8u * k);
    }
    q[w0 + 1u + w] = word;
  }
  for (uint j = 0u; j < 8u; ++j)  // int16 sums, two a word
    q[w0 + 65u + j] = (uint(sums[2u * j]) & 0xffffu) | ((uint(sums[2u * j + 1u]) & 0xffffu) << 16);
  q[w0] = floatBitsToUint(div_rn(1.0, iscale));
}
