#version 450
#extension GL_GOOGLE_include_directive : require
// The Engram gate (CpuBackend::engram_gate; spec 4.5, numerics.md 8), the CPU's bits, a
// workgroup per (stream h, token t): one invocation forms dot = sum over k in order of (x_k *
// (qn_k * kn_k)) * key_k, times x's and key's rms factors (sequential sums, the root and divisions
// correctly rounded, as rms_norm.comp) and 1/sqrt(H), and the gate sigmoid(sign(dot) *
// sqrt(max(|dot|, 1e-6))) (0 for a masked token); then every invocation writes its values
// x_k = bf16(x_k + gate * value_k). The key of stream h is kv[h], the value kv[hc].
#include "bf16.glsl"
#include "exact_div.glsl"
#define EXP_BINDING 0
#include "exp_f32.glsl"
#include "sigmoid.glsl"
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint n, width, hc;       // tokens, floats of one stream (H), streams
  uint x_at, x_stride;     // token t's streams (rows_io.glsl)
  uint kv_at, kv_stride;   // token t's keys (hc x H) and value (H)
  uint prm_at;             // [1/sqrt(H)][eps][masked: 0 or 1][q_norm: hc x H][k_norm: hc x H][mask: n]
  uint y_off, y_stride;    // token t's streams out, in the output buffer
  uint gates_only;         // tests (gpu_engram_gates): token t's gates to y_off + t * y_stride + h, X unchanged
  uint base_staged, base_in, base_out;  // rows_io.glsl: where its bindings start
} p;
#include "rows_io.glsl"

shared float gate_s;

void main() {
  const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, lid = gl_LocalInvocationID.x;
  if (h >= p.hc || t >= p.n) return;
  const uint H = p.width, x = p.x_at + t * p.x_stride + h * H, key = p.kv_at + t * p.kv_stride + h * H;
  const uint qn = p.prm_at + 3u, kn = qn + p.hc * H;
  if (lid == 0u) {
    float dot = 0.0, sx = 0.0, sk = 0.0;
    for (uint k = 0u; k < H; ++k) {
      precise float wq = rd(qn + h * H + k) * rd(kn + h * H + k);
      precise float a = rd(x + k) * wq;
      precise float b = a * rd(key + k);
      precise float c = dot + b;
      dot = c;
    }
    const float eps = rd(p.prm_at + 1u);
    for (uint k = 0u; k < H; ++k) {
      const float v = rd(x + k);
      precise float sq = v * v;
      precise float acc = sx + sq;
      sx = acc;
    }
    for (uint k = 0u; k < H; ++k) {
      const float v = rd(key + k);
      precise float sq = v * v;
      precise float acc = sk + sq;
      sk = acc;
    }
    precise float tx = div_rn(sx, float(H)) + eps;
    precise float tk = div_rn(sk, float(H)) + eps;
    const float rx = div_rn(1.0, sqrt_rn(tx)), rk = div_rn(1.0, sqrt_rn(tk));
    precise float d1 = dot * rx;
    precise float d2 = d1 * rk;
    precise float d3 = d2 * rd(p.prm_at);
    const float sgn = d3 > 0.0 ? 1.0 : (d3 < 0.0 ? -1.0 : 0.0);
    const float floor_ = uintBitsToFloat(0x358637bdu);  // 1e-6f
    const float m = abs(d3) < floor_ ? floor_ : abs(d3);   // std::max(|dot|, 1e-6f)
    precise float arg = sgn * sqrt_rn(m);
    const bool masked = rd(p.prm_at + 2u) != 0.0 && rd(kn + p.hc * H + t) != 0.0;
    gate_s = masked ? 0.0 : sigmoid(arg);
    if (p.gates_only != 0u) OUT(p.y_off + t * p.y_stride + h) = gate_s;
  }
  if (p.gates_only != 0u) return;
  barrier();
  const float gate = gate_s;
  const uint val = p.kv_at + t * p.kv_stride + p.hc * H, y = p.y_off + t * p.y_stride + h * H;
  for (uint k = lid; k < H; k += 64u) {
    precise float g = gate * rd(val + k);
    precise float s = rd(x + k) + g;
    OUT(y + k) = round_bf16(s);
  }
}
