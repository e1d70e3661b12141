#version 450
#extension GL_GOOGLE_include_directive : require
// The lightning indexer's scores (CpuBackend::index_select's float path; spec 3.4.3, numerics.md
// 6), the CPU's bits: for query t and visible key j, score = sum over heads h, in order, of
// relu(dot(k_j, q_h)) * w'_h from 0, each product and sum rounded in f32 (std::max(d, 0): d
// unless d < 0), the dot the canonical one (16 fma lanes, fma_rn.glsl) of the key's BF16 values
// (unpacked from MXFP4 as fp4_unpack_row does: bf16(e2m1 * scale), a NaN scale all NaN) with the
// query's f32 values. A candidate consumer's keys in blocks it does not keep score -inf. The top-k
// and the candidate blocks are the host's, from these scores.
// An invocation per (key, query): j = x, t = y.
#include "bf16.glsl"
#include "fma_rn.glsl"
#include "rows_io.glsl"  // the staged words (su) and the output rows
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint n;          // queries
  uint heads;
  uint head_dim;   // at most kMaxDim, a multiple of 32 (the MXFP4 block)
  uint q_at;       // word index of query t's [heads][head_dim] f32 values: q_at + t * heads * head_dim
  uint w_at;       // word index of [p0, ratio, block, units, y_stride], then w' [n][heads] f32
  uint k_at;       // byte index of the packed keys, row_bytes each, key j at k_at + j * row_bytes
  uint row_bytes;
  uint m_at;       // a consumer's kept blocks, one word each, `units` per query; ~0u: not a consumer
  uint y_off;      // query t's scores at y_off + t * y_stride of the output buffer
  uint unused0, unused1;
} p;

const uint kMaxDim = 256u;  // VulkanBackend::kIndexMaxDim

uint key_byte(uint b) { return (su[b >> 2] >> ((b & 3u) * 8u)) & 0xffu; }

// E2M1 code -> its value (numerics.h e2m1_value; 8 is -0).
float e2m1(uint c) {
  const float mag[8] = float[8](0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
  const float v = mag[c & 7u];
  return (c & 8u) != 0u ? -v : v;
}

void main() {
  const uint j = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
  if (t >= p.n) return;
  const uint p0 = su[p.w_at], ratio = su[p.w_at + 1u], block = su[p.w_at + 2u], units = su[p.w_at + 3u];
  const uint y_stride = su[p.w_at + 4u];
  const uint n_vis = (p0 + t + 1u) / ratio;
  if (j >= n_vis) return;
  const uint y = p.y_off + t * y_stride + j;
  if (p.m_at != 0xffffffffu && su[p.m_at + t * units + j / block] == 0u) {
    rows[y] = uintBitsToFloat(0xff800000u);  // -inf: a block the consumer does not keep
    return;
  }
  const uint hd = p.head_dim;
  float key[kMaxDim];
  const uint row = p.k_at + j * p.row_bytes;
  for (uint b = 0u; b < hd; b += 32u) {
    const uint code = key_byte(row + hd / 2u + b / 32u);  // E8M0 (kernels/fp.h e8m0_to_f32)
    const bool nan_scale = code == 0xffu;
    const float s = code == 0u ? uintBitsToFloat(0x00400000u) : uintBitsToFloat(code << 23);
    for (uint i = 0u; i < 32u; ++i) {
      const uint e = b + i, byte = key_byte(row + e / 2u);
      const uint c = (e & 1u) != 0u ? byte >> 4 : byte & 15u;
      precise float v = e2m1(c) * s;
      key[e] = nan_scale ? uintBitsToFloat(0x7fc00000u) : round_bf16(v);
    }
  }
  const uint q0 = p.q_at + t * p.heads * hd, w0 = p.w_at + 5u + t * p.heads;
  precise float score = 0.0;
  for (uint h = 0u; h < p.heads; ++h) {
    precise float acc[16];
    for (uint l = 0u; l < 16u; ++l) acc[l] = 0.0;
    const uint padded = (hd + 15u) / 16u * 16u;
    for (uint i = 0u; i < padded; ++i) {
      const float k = i < hd ? key[i] : 0.0;
      const float q = i < hd ? uintBitsToFloat(su[q0 + h * hd + i]) : 0.0;
      acc[i % 16u] = fma_rn(k, q, acc[i % 16u]);
    }
    for (uint width = 8u; width >= 2u; width /= 2u)
      for (uint i = 0u; i < width; ++i) acc[i] = acc[i] + acc[i + width];
    precise float d = acc[0] + acc[1];
    const float r = d < 0.0 ? 0.0 : d;
    precise float m = r * uintBitsToFloat(su[w0 + h]);
    score = score + m;
  }
  rows[y] = score;
}
