#version 450
#extension GL_GOOGLE_include_directive : require
// The lightning indexer's scores (CpuBackend::index_select's float path; spec 3.4.3, numerics.md
// 6), the CPU's bits: for query t and visible key j, score = sum over heads h, in order, of
// relu(dot(k_j, q_h)) * w'_h from 0, each product and sum rounded in f32 (std::max(d, 0): d
// unless d < 0), the dot the canonical one (16 fma lanes, fma_rn.glsl) of the key's BF16 values
// (unpacked from MXFP4 as fp4_unpack_row does: bf16(e2m1 * scale), a NaN scale all NaN) with the
// query's f32 values, w' = w / denom with the division corrected. A candidate consumer's keys in
// blocks it does not keep score -inf. The top-k and the candidate blocks are the host's, from
// these scores. The queries and the head weights are read where the batch writes them or staged
// (rows_io.glsl), the keys, the kept blocks and the shape staged.
// An invocation per (key, query): j = x, t = y.
#include "bf16.glsl"
#include "exact_div.glsl"
#include "fma_rn.glsl"
#include "fp_grids.glsl"
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint n;                // queries
  uint h_at;             // word index of [p0, ratio, block, units, denom (f32), heads, head_dim, pend_at]
  uint q_at, q_stride;   // query t's [heads][head_dim] values at q_at + t * q_stride (rows_io places)
  uint w_at, w_stride;   // its head weights (before 1 / denom) at w_at + t * w_stride
  uint k_at;             // byte index of the packed keys, row_bytes each, key j at k_at + j * row_bytes
  uint row_bytes;
  uint m_at;             // a consumer's kept blocks, one word each, `units` per query; ~0u: not a consumer
  uint y_off, y_stride;  // query t's scores at y_off + t * y_stride of the output buffer
  uint base_staged, base_in, base_out;  // rows_io.glsl: where its bindings start
} p;
#include "rows_io.glsl"

const uint kMaxDim = 256u;  // VulkanBackend::kIndexMaxDim

uint key_byte(uint b) { return (SU(b >> 2) >> ((b & 3u) * 8u)) & 0xffu; }

// E2M1 code -> its value (numerics.h e2m1_value; 8 is -0).
float e2m1(uint c) {
  const float mag[8] = float[8](0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
  const float v = mag[c & 7u];
  return (c & 8u) != 0u ? -v : v;
}

void main() {
  const uint j = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
  if (t >= p.n) return;
  const uint p0 = SU(p.h_at), ratio = SU(p.h_at + 1u), block = SU(p.h_at + 2u), units = SU(p.h_at + 3u);
  const float denom = uintBitsToFloat(SU(p.h_at + 4u));
  const uint heads = SU(p.h_at + 5u), hd = SU(p.h_at + 6u), pend_at = SU(p.h_at + 7u);
  const uint n_vis = (p0 + t + 1u) / ratio;
  if (j >= n_vis) return;
  const uint y = p.y_off + t * p.y_stride + j;
  if (p.m_at != 0xffffffffu && SU(p.m_at + t * units + j / block) == 0u) {
    OUT(y) = uintBitsToFloat(0xff800000u);  // -inf: a block the consumer does not keep
    return;
  }
  float key[kMaxDim];
  const uint pend = pend_at != 0xffffffffu ? SU(pend_at + j) : 0xffffffffu;
  if (pend != 0xffffffffu) {
    // A key a pending store_fp4 of the batch writes: its f32 values where the batch holds them,
    // put on the MXFP4 grid as fp4_pack_row will pack them (fake_quant_mxfp4: the unpacked values;
    // a NaN stays in its element where the packed block is all NaN, and the score is NaN either way).
    const uint at = pend & 0x7fffffffu;
    for (uint b = 0u; b < hd; b += 32u) {
      float amax = 0.0;
      for (uint i = 0u; i < 32u; ++i) {
        const float a = abs(IN(at + b + i));
        amax = amax < a ? a : amax;  // std::max(amax, |v|)
      }
      const float lo = uintBitsToFloat(0x01c00000u);  // 6 * 2^-126
      const float s = pow2_ceil(div_rn(amax < lo ? lo : amax, 6.0));
      for (uint i = 0u; i < 32u; ++i) {
        precise float y = e2m1_rne(div_rn(IN(at + b + i), s)) * s;
        key[b + i] = round_bf16(y);
      }
    }
  }
  const uint row = p.k_at + j * p.row_bytes;
  for (uint b = 0u; pend == 0xffffffffu && b < hd; b += 32u) {
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
  const uint q0 = p.q_at + t * p.q_stride, w0 = p.w_at + t * p.w_stride;
  precise float score = 0.0;
  for (uint h = 0u; h < heads; ++h) {
    precise float acc[16];
    for (uint l = 0u; l < 16u; ++l) acc[l] = 0.0;
    const uint padded = (hd + 15u) / 16u * 16u;
    for (uint i = 0u; i < padded; ++i) {
      const float k = i < hd ? key[i] : 0.0;
      const float q = i < hd ? rd(q0 + h * hd + i) : 0.0;
      acc[i % 16u] = fma_rn(k, q, acc[i % 16u]);
    }
    for (uint width = 8u; width >= 2u; width /= 2u)
      for (uint i = 0u; i < width; ++i) acc[i] = acc[i] + acc[i + width];
    precise float d = acc[0] + acc[1];
    const float r = d < 0.0 ? 0.0 : d;
    precise float m = r * div_rn(rd(w0 + h), denom);  // w' (numerics.md 6)
    score = score + m;
  }
  OUT(y) = score;
}
