#version 450
#extension GL_GOOGLE_include_directive : require
// F32 / F16 / BF16 weights x F32 activations: kernels/float_types.cpp canonical_dot. 16 lanes
// (lane = i mod 16) accumulate fma(w_i, x_i, lane) over the row zero-padded to 16, then the fixed
// reduction 8-4-2-1 and lane 0 + lane 1.
// The CPU's fma rounds once: fma_rn.glsl computes it exactly. The backend runs this shader only
// on devices with shaderFloat64; elsewhere these weights stay on the CPU.
#include "linear_common.glsl"
#include "fma_rn.glsl"

float weight_at(uint row_off, uint i) {
  if (p.kind == 0u) return uintBitsToFloat(w[(row_off >> 2) + i]);
  const uint h = w_u16(row_off + 2u * i);
  return p.kind == 1u ? half_to_float(h) : uintBitsToFloat(h << 16);
}

// The lanes' fixed reduction 8-4-2-1, then lane 0 + lane 1.
float reduced(inout precise float acc[16]) {
  for (uint width = 8u; width >= 2u; width /= 2u)
    for (uint i = 0u; i < width; ++i) acc[i] = acc[i] + acc[i + width];
  precise float s = acc[0] + acc[1];
  return s;
}

#ifdef FLOAT_GEMM
// The GEMM build (prefill): a workgroup computes tiles of TR rows x TT tokens, an invocation per
// output. KC columns at a time, the tile's weight rows (as f32) and activation rows are staged in
// workgroup memory, so a weight value is read from the buffer once per TT tokens and an
// activation once per TR rows. Each output runs the GEMV build's sequence of fmas, padding
// included (KC is a multiple of the 16 lanes), so the bits are the same.
#define TR 8u
#define TT 8u
#define KC 64u
shared float fw[TR * KC];
shared float fa[TT * KC];

void main() {
  const uint lid = gl_LocalInvocationID.x, lr = lid % TR, lt = lid / TR;
  const uint t0 = gl_WorkGroupID.y * TT, t = t0 + lt;
  const uint padded = (p.cols + 15u) / 16u * 16u;
  // Row tiles in turn (grid-stride), the same for every invocation of the workgroup.
  for (uint rb = gl_WorkGroupID.x * TR; rb < p.rows; rb += gl_NumWorkGroups.x * TR) {
    precise float acc[16];
    for (uint k = 0u; k < 16u; ++k) acc[k] = 0.0;
    for (uint c0 = 0u; c0 < padded; c0 += KC) {
      barrier();  // every invocation is done with the chunk before
      for (uint i = lid; i < TR * KC; i += TR * TT) {
        const uint r = rb + i / KC, c = c0 + i % KC;
        fw[i] = r < p.rows && c < p.cols ? weight_at(p.w_off + (p.row0 + r) * p.w_row_bytes, c) : 0.0;
      }
      for (uint i = lid; i < TT * KC; i += TR * TT) {
        const uint tt = t0 + i / KC, c = c0 + i % KC;
        fa[i] = tt < p.n && c < p.cols ? uintBitsToFloat(a[((tt * p.a_stride) >> 2) + c]) : 0.0;
      }
      barrier();
      const uint end = min(KC, padded - c0);
      for (uint i = 0u; i < end; ++i) acc[i % 16u] = fma_rn(fw[lr * KC + i], fa[lt * KC + i], acc[i % 16u]);
    }
    const float s = reduced(acc);
    if (rb + lr < p.rows && t < p.n) store_out(rb + lr, t, s);
  }
}
#else
void main() {
  const uint r = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (r >= p.rows || t >= p.n) return;
  const uint wo = p.w_off + (p.row0 + r) * p.w_row_bytes, ao = (t * p.a_stride) >> 2;
  precise float acc[16];
  for (uint k = 0u; k < 16u; ++k) acc[k] = 0.0;
  const uint padded = (p.cols + 15u) / 16u * 16u;
  for (uint i = 0u; i < padded; ++i) {
    const float wv = i < p.cols ? weight_at(wo, i) : 0.0;
    const float av = i < p.cols ? uintBitsToFloat(a[ao + i]) : 0.0;
    acc[i % 16u] = fma_rn(wv, av, acc[i % 16u]);
  }
  store_out(r, t, reduced(acc));
}
#endif
