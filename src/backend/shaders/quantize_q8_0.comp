#version 450
#extension GL_GOOGLE_include_directive : require
// Q8_0 activations (kernels/iquant_types.cpp quantize_row_q8_0, ggml's reference rule): per block
// of 32, d = amax / 127, id = 1 / d, codes roundf(x * id) (ties away from zero), the scale stored as
// fp16(d). One invocation per pair of blocks: 68 bytes, whole words.
#include "quantize_common.glsl"
layout(local_size_x = 64) in;

// roundf: nearest, ties away from zero; v - trunc(v) is exact.
float round_away(float v) {
  const float t = trunc(v);
  precise float f = v - t;
  return abs(f) >= 0.5 ? t + sign(v) : t;
}

void main() {
  const uint u = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (u >= p.units || t >= p.n) return;
  const uint blocks = p.cols / 32u, b0 = 2u * u, nb = min(2u, blocks - b0);
  uint words[17];
  for (uint i = 0u; i < 17u; ++i) words[i] = 0u;
  for (uint k = 0u; k < nb; ++k) {
    const uint base = (b0 + k) * 32u;
    float amax = 0.0;
    for (uint j = 0u; j < 32u; ++j) {
      const float a = abs(in_at(t, base + j));
      amax = amax < a ? a : amax;  // std::max(amax, a)
    }
    const float d = div_rn(amax, 127.0);
    const float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
    const uint o = k * 34u;  // byte offset of the block within the pair
    const uint h = f32_to_f16(d);
    words[o >> 2] |= (h & 0xffu) << ((o & 3u) * 8u);
    words[(o + 1u) >> 2] |= (h >> 8) << (((o + 1u) & 3u) * 8u);
    for (uint j = 0u; j < 32u; ++j) {
      precise float v = in_at(t, base + j) * id;
      const float r = round_away(v);
      const int c = isnan(r) ? 0 : int(clamp(r, -127.0, 127.0));
      const uint at = o + 2u + j;
      words[at >> 2] |= (uint(c) & 0xffu) << ((at & 3u) * 8u);
    }
  }
  const uint w0 = (t * p.out_stride + u * 68u) >> 2, nw = (nb * 34u + 3u) / 4u;
  for (uint i = 0u; i < nw; ++i) q[w0 + i] = words[i];
}
