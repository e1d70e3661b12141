#version 450
#extension GL_GOOGLE_include_directive : require
// The compressor's pooling (CpuBackend::compress_pool; spec 3.4.2), the CPU's bits, for the groups
// a chunk completes: per channel d, over the group's `ratio` members in position order, the
// softmax of the gate logits s (max, exp_f32(s - max) summed in order into the denominator) weights
// the projections k, acc += k * (e / den) from 0, each step rounded, the division correctly
// rounded; latent = bf16(acc). Ratio 1: latent = bf16(k). The host lists each group's members
// (a place each for k and s: a row the batch writes, a row of the chunk staged, or the carry the
// sequence kept from the chunk before), so a group open across two chunks reads both.
// An invocation per channel, a group per y.
#include "bf16.glsl"
#include "exact_div.glsl"
#define EXP_BINDING 0
#include "exp_f32.glsl"
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint n;                // groups
  uint width;            // channels
  uint ratio;            // members of a group
  uint m_at;             // word index of the members: per group, per member, (k place, s place)
  uint y_off, y_stride;  // group q's latent at y_off + q * y_stride of the output buffer
  uint unrounded;        // tests (gpu_compress_pool_unrounded): the pooled f32 values, not bf16
  uint unused1, unused2, unused3, unused4;
  uint base_staged, base_in, base_out;  // rows_io.glsl: where its bindings start
} p;
#include "rows_io.glsl"  // staged rows (f32) and the members table (words)

void main() {
  const uint d = gl_GlobalInvocationID.x, q = gl_WorkGroupID.y;
  if (d >= p.width || q >= p.n) return;
  const uint m = p.m_at + q * 2u * p.ratio;
  float pooled;
  if (p.ratio == 1u) {
    pooled = rd(SU(m) + d);
  } else {
    float mx = rd(SU(m + 1u) + d);
    for (uint a = 1u; a < p.ratio; ++a) {
      const float s = rd(SU(m + 2u * a + 1u) + d);
      mx = mx < s ? s : mx;  // std::max(mx, s)
    }
    precise float den = 0.0;
    for (uint a = 0u; a < p.ratio; ++a) {
      precise float arg = rd(SU(m + 2u * a + 1u) + d) - mx;
      den = den + exp_f32(arg);
    }
    precise float acc = 0.0;
    for (uint a = 0u; a < p.ratio; ++a) {
      precise float arg = rd(SU(m + 2u * a + 1u) + d) - mx;
      const float w = div_rn(exp_f32(arg), den);
      precise float prod = rd(SU(m + 2u * a) + d) * w;
      acc = acc + prod;
    }
    pooled = acc;
  }
  OUT(p.y_off + q * p.y_stride + d) = p.unrounded != 0u ? pooled : round_bf16(pooled);
}
