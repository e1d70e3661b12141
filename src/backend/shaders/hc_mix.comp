#version 450
#extension GL_GOOGLE_include_directive : require
// The hyper-connection mixes of a token (CpuBackend::hc_mix after its projections; kernels/
// numerics.cpp rms_factor, hc_mix_from_projections; spec 3.2), the CPU's bits. m = raw * r, the
// projections of the flattened streams X times X's rms factor r (the sequential f32 sum, as
// rms_norm.comp); pre = sigmoid(m * scale0 + base) + eps, post = 2 sigmoid(m * scale1 + base), and
// comb = Sinkhorn(m * scale2 + base): a max-subtracted row softmax plus eps, then columns divided
// by their sum plus eps, then `iters - 1` rounds of rows and columns so. sigmoid(x) = 1 / (1 +
// exp_f32(-x)); every division correctly rounded (exact_div.glsl), every operation in the CPU's
// order under `precise`. An invocation per token: the work is a few hundred operations and one pass
// over X.
#include "exact_div.glsl"
#define EXP_BINDING 0
#include "exp_f32.glsl"
#include "sigmoid.glsl"
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint n;                   // tokens
  uint width;               // floats of X per token (hc streams)
  uint hc;                  // streams, at most 8
  uint iters;               // Sinkhorn iterations
  uint raw_at, raw_stride;  // token t's hc * (2 + hc) projections (rows_io.glsl)
  uint x_at, x_stride;      // token t's streams
  uint prm_at;              // base[hc * (2 + hc)], scale[3], hc_eps, norm_eps
  uint y_off, y_stride;     // token t's mixes at y_off + t * y_stride of the output buffer
  uint base_staged, base_in, base_out;  // rows_io.glsl: where its bindings start
} p;
#include "rows_io.glsl"

void main() {
  const uint t = gl_GlobalInvocationID.x;
  if (t >= p.n) return;
  const uint hc = p.hc, nmix = hc * (2u + hc), xb = p.x_at + t * p.x_stride;
  const float eps = rd(p.prm_at + nmix + 3u), norm_eps = rd(p.prm_at + nmix + 4u);
  float ss = 0.0;
  for (uint i = 0u; i < p.width; ++i) {
    const float v = rd(xb + i);
    precise float sq = v * v;
    precise float acc = ss + sq;
    ss = acc;
  }
  const float mean = div_rn(ss, float(p.width));
  precise float tt = mean + norm_eps;
  const float r = div_rn(1.0, sqrt_rn(tt));

  float m[80];  // nmix <= 8 * 10
  for (uint k = 0u; k < nmix; ++k) {
    precise float v = rd(p.raw_at + t * p.raw_stride + k) * r;
    m[k] = v;
  }
  const uint y = p.y_off + t * p.y_stride;
  for (uint h = 0u; h < hc; ++h) {
    precise float a = m[h] * rd(p.prm_at + nmix) + rd(p.prm_at + h);
    precise float pre = sigmoid(a) + eps;
    OUT(y + h) = pre;
    precise float b = m[hc + h] * rd(p.prm_at + nmix + 1u) + rd(p.prm_at + hc + h);
    precise float post = 2.0 * sigmoid(b);
    OUT(y + hc + h) = post;
  }
  float C[64];
  for (uint k = 0u; k < hc * hc; ++k) {
    precise float c = m[2u * hc + k] * rd(p.prm_at + nmix + 2u) + rd(p.prm_at + 2u * hc + k);
    C[k] = c;
  }
  // First iteration: row softmax (max-subtracted) + eps.
  for (uint i = 0u; i < hc; ++i) {
    float mx = C[i * hc];
    for (uint j = 1u; j < hc; ++j) mx = mx < C[i * hc + j] ? C[i * hc + j] : mx;  // std::max
    float s = 0.0;
    for (uint j = 0u; j < hc; ++j) {
      precise float z = C[i * hc + j] - mx;
      const float e = exp_f32(z);
      C[i * hc + j] = e;
      precise float acc = s + e;
      s = acc;
    }
    for (uint j = 0u; j < hc; ++j) {
      precise float v = div_rn(C[i * hc + j], s) + eps;
      C[i * hc + j] = v;
    }
  }
  for (uint it = 0u; it < max(p.iters, 1u); ++it) {  // as the CPU: columns at least once
    if (it > 0u)  // rows
      for (uint i = 0u; i < hc; ++i) {
        float s = 0.0;
        for (uint j = 0u; j < hc; ++j) {
          precise float acc = s + C[i * hc + j];
          s = acc;
        }
        precise float d = s + eps;
        for (uint j = 0u; j < hc; ++j) C[i * hc + j] = div_rn(C[i * hc + j], d);
      }
    for (uint j = 0u; j < hc; ++j) {  // columns
      float s = 0.0;
      for (uint i = 0u; i < hc; ++i) {
        precise float acc = s + C[i * hc + j];
        s = acc;
      }
      precise float d = s + eps;
      for (uint i = 0u; i < hc; ++i) C[i * hc + j] = div_rn(C[i * hc + j], d);
    }
  }
  for (uint k = 0u; k < hc * hc; ++k) OUT(y + 2u * hc + k) = C[k];
}
