#version 450
#extension GL_GOOGLE_include_directive : require
// Sparse attention with sinks (CpuBackend::attend_group; spec 3.4.4, numerics.md 6), the CPU's
// bits, for one (head, token) per workgroup over the BF16 rows the host staged for that token (its
// window rows ascending, then its selected compressed rows ascending; one shared KV head, keys =
// values): scores s_k = dot(row_k, q_h) * scale by the canonical dot (16 fma lanes, fma_rn.glsl),
// a score per invocation; then one invocation takes the max, p_k = exp_f32(s_k - max) summed in
// order into the denominator and kept as bf16(p_k), and adds the sink's exp_f32(sink - max); then
// an invocation per output value sums bf16(p_k) * row_k[d] in row order and writes
// bf16(sum / denominator), the division correctly rounded.
#include "bf16.glsl"
#include "exact_div.glsl"
#include "fma_rn.glsl"
#define EXP_BINDING 0
#include "exp_f32.glsl"
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint n, heads, head_dim;
  uint q_at, q_stride;  // token t's queries at q_at + t * q_stride, bit 31 set: in the output buffer
  uint kv_at;           // word index of the staged rows, head_dim values each
  uint list_at;         // [scale bits][sinks: heads][per token: first, count][row ids (kv())], words
  uint y_off, y_stride; // token t's output at y_off + t * y_stride of the output buffer
  uint unused0, unused1;
  uint base_staged, base_in, base_out;  // rows_io.glsl: where its bindings start
} p;
// The activation buffer's words: the staged rows (BF16, two a word, low half first), the lists
// and staged queries (f32); rd() reads a query where it lies.
#include "rows_io.glsl"

const uint kMaxRows = 2048u;  // VulkanBackend::kAttentionRows
shared float sc[kMaxRows];    // the scores, then bf16(p_k)
shared float den_s;

// The rows the device keeps between steps (VulkanBackend::kv_, --gpu-kv): head_dim * 2 bytes a
// slot, holding a window row's BF16 values (two a word) or a compressed row as it is cached,
// packed on the NVFP4 grid (kernels/fp4_rows.h: head_dim / 2 bytes of E2M1 codes, then an E4M3
// scale per 16). Bound to the tables when it keeps none (then no id names a slot).
layout(std430, set = 0, binding = 3) readonly buffer Kept { uint kept[]; };

uint kept_byte(uint b) { return (kept[b >> 2] >> ((b & 3u) * 8u)) & 0xffu; }

// kernels/fp.h e4m3_to_f32, exactly: the value is built from its bits.
float e4m3_value(uint c) {
  const uint e = (c >> 3) & 15u, m = c & 7u;
  if (e == 15u && m == 7u) return uintBitsToFloat(0x7fc00000u);
  const float mag = e == 0u ? float(m) * uintBitsToFloat((127u - 9u) << 23) : uintBitsToFloat(((e + 120u) << 23) | (m << 20));
  return (c & 0x80u) != 0u ? -mag : mag;
}

// fp4_unpack_row's value d of a packed NVFP4 row at byte `base` of the kept rows: bf16(q * s),
// which is q * s (a 3-bit by 4-bit product of normal numbers: exact in BF16), and the one NaN
// for a block whose scale is NaN.
float nvfp4_value(uint base, uint d) {
  const float s = e4m3_value(kept_byte(base + p.head_dim / 2u + d / 16u));
  if (isnan(s)) return uintBitsToFloat(0x7fc00000u);
  const uint c = (kept_byte(base + d / 2u) >> ((d & 1u) * 4u)) & 15u;
  const float e2m1[8] = float[8](0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
  const float q = (c & 8u) != 0u ? -e2m1[c & 7u] : e2m1[c & 7u];
  precise float v = q * s;
  return v;
}

// Row r's value d: a staged BF16 row; (bit 30 set) the row in that slot of the kept rows, BF16
// or (bit 29 set too) packed; or (bit 31 set) f32 values at that place of the output buffer (a
// row the batch writes and a store_bf16 of it will keep; BF16-exact).
float kv(uint r, uint d) {
  if ((r & 0x80000000u) != 0u) return IN((r & 0x7fffffffu) + d);
  if ((r & 0x60000000u) == 0x60000000u) return nvfp4_value((r & 0x1fffffffu) * p.head_dim * 2u, d);
  const uint w = (r & 0x40000000u) != 0u ? kept[((r & 0x1fffffffu) * p.head_dim + d) / 2u]
                                         : SU(p.kv_at + (r * p.head_dim + d) / 2u);
  return uintBitsToFloat(((d & 1u) != 0u ? (w >> 16) : (w & 0xffffu)) << 16);
}

void main() {
  const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, lid = gl_LocalInvocationID.x;
  if (h >= p.heads || t >= p.n) return;
  const uint hd = p.head_dim, lists = p.list_at + 1u + p.heads;
  const float scale = uintBitsToFloat(SU(p.list_at)), sink = uintBitsToFloat(SU(p.list_at + 1u + h));
  const uint first = SU(lists + 2u * t), count = min(SU(lists + 2u * t + 1u), kMaxRows);
  const uint ids = lists + 2u * p.n + first;
  const uint q = p.q_at + t * p.q_stride + h * hd;
  for (uint k = lid; k < count; k += 64u) {
    const uint r = SU(ids + k);
    precise float acc[16];
    for (uint l = 0u; l < 16u; ++l) acc[l] = 0.0;
    const uint padded = (hd + 15u) / 16u * 16u;
    for (uint i = 0u; i < padded; ++i) {
      const float w = i < hd ? kv(r, i) : 0.0;
      const float a = i < hd ? rd(q + i) : 0.0;
      acc[i % 16u] = fma_rn(w, a, acc[i % 16u]);
    }
    for (uint width = 8u; width >= 2u; width /= 2u)
      for (uint i = 0u; i < width; ++i) acc[i] = acc[i] + acc[i + width];
    precise float s = acc[0] + acc[1];
    precise float v = s * scale;
    sc[k] = v;
  }
  barrier();
  if (lid == 0u) {
    float mx = uintBitsToFloat(0xff800000u);  // -inf
    for (uint k = 0u; k < count; ++k) mx = mx < sc[k] ? sc[k] : mx;  // std::max
    float den = 0.0;
    for (uint k = 0u; k < count; ++k) {
      precise float z = sc[k] - mx;
      const float e = exp_f32(z);
      precise float d = den + e;
      den = d;
      sc[k] = round_bf16(e);  // the probability in the numerator only, BF16
    }
    precise float zs = sink - mx;
    precise float ds = den + exp_f32(zs);
    den_s = ds;
  }
  barrier();
  const float den = den_s;
  for (uint d = lid; d < hd; d += 64u) {
    float acc = 0.0;
    for (uint k = 0u; k < count; ++k) {
      precise float m = sc[k] * kv(SU(ids + k), d);
      precise float a = acc + m;
      acc = a;
    }
    OUT(p.y_off + t * p.y_stride + h * hd + d) = round_bf16(div_rn(acc, den));
  }
}
